package runner

import (
	"github.com/llm-d/llm-d-router/pkg/epp/config/loader"
	"github.com/llm-d/llm-d-router/pkg/epp/flowcontrol"
	fwkplugin "github.com/llm-d/llm-d-router/pkg/epp/framework/interface/plugin"
	"github.com/llm-d/llm-d-router/pkg/epp/framework/plugins/requestcontrol/dataproducer/tokens"
	"github.com/llm-d/llm-d-router/pkg/epp/framework/plugins/scheduling/filter/bylabel"
	"github.com/llm-d/llm-d-router/pkg/epp/framework/plugins/scheduling/filter/foo"
	"github.com/llm-d/llm-d-router/pkg/epp/framework/plugins/scheduling/scorer/bar"
	"github.com/llm-d/llm-d-router/pkg/epp/framework/plugins/scheduling/scorer/prefix"
	"github.com/llm-d/llm-d-router/pkg/epp/metrics"
	runserver "github.com/llm-d/llm-d-router/pkg/epp/server"
)

type Runner struct{}

// Register calls outside registerInTreePlugins are not plugin types.
func (r *Runner) setup() {
	metrics.Register(r.collectors()...)
	fwkplugin.Register(foo.OutsideType, fwkplugin.StabilityAlpha, foo.Factory)
}

// registerInTreePlugins registers the factory functions of all known plugins
func (r *Runner) registerInTreePlugins() {
	// fwkplugin.Register(bar.CommentedOutType, fwkplugin.StabilityBeta, bar.Factory)
	fwkplugin.Register(prefix.PrefixCacheScorerPluginType, fwkplugin.StabilityBeta, prefix.Factory)
	fwkplugin.Register(foo.FooFilterType, fwkplugin.StabilityAlpha, foo.Factory)
	fwkplugin.Register(bar.BarScorerType, fwkplugin.StabilityBeta, bar.Factory)
	fwkplugin.RegisterDeprecated(bylabel.ByLabelType, fwkplugin.StabilityBeta, bylabel.Factory, "v0.9.0", "v0.11.0", bylabel.SelectorType) //nolint:staticcheck
	fwkplugin.Register(bylabel.SelectorType, fwkplugin.StabilityBeta, bylabel.SelectorFactory)
	fwkplugin.RegisterAsDefaultProducer(tokens.ProducerType, fwkplugin.StabilityBeta, tokens.Factory,
		tokens.TokensDataKey)
	fwkplugin.Register(bar.BarScorerType, fwkplugin.StabilityBeta, bar.Factory)
	metrics.Register(r.collectors()...)
}

func (r *Runner) parseConfigurationPhaseOne() {
	loader.RegisterFeatureGate(flowcontrol.FeatureGate, false)
	loader.RegisterFeatureGate(runserver.SpeculativeFeatureGate, true)
	r.registerInTreePlugins()
}
