package metrics

import "fmt"

const (
	// LLMDRouterEndpointPickerSubsystem is the subsystem for llm-d router endpoint picker metrics.
	LLMDRouterEndpointPickerSubsystem = "llm_d_epp"
)

func HelpMsgWithStability(msg string, stability string) string {
	return fmt.Sprintf("[%v] %v", stability, msg)
}
