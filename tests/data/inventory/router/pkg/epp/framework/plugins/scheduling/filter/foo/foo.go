package foo

const FooFilterType = "foo-filter"

const OutsideType = "outside-filter"

func Factory() {}
