package limiter

// TopFields are the configuration's fields, for the tests that hold the
// documentation to them.
var TopFields = topFields
