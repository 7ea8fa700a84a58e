package bar

const (
	scorerSuffix  = "-scorer"
	BarScorerType = "bar" + scorerSuffix
)

func Factory() {}
