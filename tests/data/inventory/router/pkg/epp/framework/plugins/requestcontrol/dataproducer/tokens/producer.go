package tokens

import "github.com/llm-d/llm-d-router/pkg/epp/framework/plugins/scheduling/scorer/prefix"

// ProducerType is built from another package's constant.
const ProducerType = prefix.PrefixCacheScorerPluginType + "-producer"

const TokensDataKey = "tokens"

func Factory() {}
