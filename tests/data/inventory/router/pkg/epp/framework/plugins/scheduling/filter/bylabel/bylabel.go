package bylabel

const (
	// ByLabelType is the deprecated name.
	ByLabelType  = "by-label"
	SelectorType = "label-selector-filter"
)

func Factory()         {}
func SelectorFactory() {}
