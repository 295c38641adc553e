package limiter

// TopFields are the configuration's fields, for the tests that hold the
// documentation to them.
var TopFields = topFields

// RuleFields and BreakerFields are the fields of a cost rule and of the
// breaker, for the test that holds the Helm chart's schema to them.
var (
	RuleFields    = ruleFields
	BreakerFields = breakerFields
)
