package limiter

import "strconv"

// The filter's local replies carry an RFC 9457 problem body
// (application/problem+json): type, title, status and detail, plus the
// "error" code the earlier JSON bodies had, kept as an extension member for
// clients that read it. 429s use the ratelimit-headers draft's problem type
// with its violated-policies member.

// ProblemContentType is the content-type of every local reply.
const ProblemContentType = "application/problem+json"

// QuotaExceededType is the draft's problem type for a 429.
const QuotaExceededType = "https://iana.org/assignments/http-problem-types#quota-exceeded"

// Bodies of the replies that hold nothing of the request: constants.
const (
	missingKeyBody = `{"type":"about:blank","title":"Unauthorized","status":401,` +
		`"detail":"this API requires an API key","error":"missing_api_key"}`
	invalidKeyBody = `{"type":"about:blank","title":"Unauthorized","status":401,` +
		`"detail":"the API key is malformed: it must be 1 to 256 visible ASCII characters","error":"invalid_api_key"}`
	unknownKeyBody = `{"type":"about:blank","title":"Forbidden","status":403,` +
		`"detail":"the API key is not known","error":"unknown_api_key"}`
)

// appendQuotaProblem appends the body of a 429 for a request of cost denied
// under q: retry is its Retry-After in seconds, 0 when the request can never
// succeed (cost above the capacity), which the detail then says instead.
func appendQuotaProblem(b []byte, q *quota, cost, retry int64) []byte {
	name := policyName(q.plan)
	b = append(b, `{"type":"`+QuotaExceededType+`","title":"Request cannot be satisfied as assigned quota has been exceeded","status":429,"detail":"this request costs `...)
	b = strconv.AppendInt(b, cost, 10)
	if retry > 0 {
		if cost == 1 {
			b = append(b, ` quota unit and `...)
		} else {
			b = append(b, ` quota units and `...)
		}
		b = strconv.AppendInt(b, q.remaining, 10)
		b = append(b, ` remain in policy `...)
		b = appendJSONText(b, name)
		b = append(b, `; retry after `...)
		b = strconv.AppendInt(b, retry, 10)
		b = append(b, ` s","violated-policies":[`...)
	} else {
		b = append(b, ` quota units and policy `...)
		b = appendJSONText(b, name)
		b = append(b, ` holds at most `...)
		b = strconv.AppendInt(b, q.limit, 10)
		b = append(b, `: it can never succeed, do not retry it","violated-policies":[`...)
	}
	b = append(b, '"')
	b = appendJSONText(b, name)
	if retry > 0 {
		b = append(b, `"],"error":"rate_limited","retry_after":`...)
		b = strconv.AppendInt(b, retry, 10)
		return append(b, '}')
	}
	return append(b, `"],"error":"cost_above_limit"}`...)
}

// appendJSONText appends s escaped for the inside of a JSON string
// (RFC 8259, section 7): quotation mark and backslash escaped, control
// characters as \u00XX; every other byte as it is.
func appendJSONText(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '"' || c == '\\':
			b = append(b, '\\', c)
		case c < 0x20:
			b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
		default:
			b = append(b, c)
		}
	}
	return b
}
