package prefix

const (
	// PrefixCacheScorerPluginType is the type of the prefix cache scorer.
	PrefixCacheScorerPluginType = "prefix-cache-scorer"
)

func Factory() {}
