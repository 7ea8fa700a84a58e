package v1alpha1

import (
	"encoding/json"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// EndpointPickerConfig is the Schema for the endpointpickerconfigs API
type EndpointPickerConfig struct {
	metav1.TypeMeta `json:",inline"`

	// +optional
	FeatureGates FeatureGates `json:"featureGates,omitempty"`

	Plugins []PluginSpec `json:"plugins"`

	FlowControl *FlowControlConfig `json:"flowControl,omitempty"`

	internalNote string
}

type PluginSpec struct {
	Name       string          `json:"name"`
	Type       string          `json:"type"`
	Parameters json.RawMessage `json:"parameters"`
}

type FeatureGates []string

type FlowControlConfig struct {
	MaxBytes      *resource.Quantity   `json:"maxBytes,omitempty"`
	PriorityBands []PriorityBandConfig `json:"priorityBands,omitempty"`
	Ignored       string               `json:"-"`
}

type PriorityBandConfig struct {
	Priority int `json:"priority"`
	// DefaultRequestTTL is new: the band's own queue-wait bound.
	DefaultRequestTTL *metav1.Duration `json:"defaultRequestTTL,omitempty"`
}
