package dashboard

import (
	"bytes"
	"encoding/json"
	"unicode/utf8"
)

// A reader of endpoint 14's body without reflection, for the bodies a
// dashboard sends: it decodes what it can tell encoding/json decodes to
// the same values, and says when it cannot (then encoding/json decodes
// it, with its errors). The body must be valid JSON (json.Valid): it
// then only has to find the values. A key is taken when it is a field's
// name exactly, without escapes; a key that encoding/json would match to
// a field otherwise (another case, an escape) is not its to read; other
// keys are skipped as encoding/json skips them. String fields take
// strings without escapes only. TestDecodeQueriesFast and
// FuzzDecodeQueriesFast hold it to encoding/json.

// skipSpace is the index of the first byte from i that is not JSON
// whitespace.
func skipSpace(data []byte, i int) int {
	for i < len(data) && (data[i] == ' ' || data[i] == '\t' || data[i] == '\n' || data[i] == '\r') {
		i++
	}
	return i
}

// skipValue is the index after the value of valid JSON starting at i.
func skipValue(data []byte, i int) int {
	depth := 0
	for i < len(data) {
		switch data[i] {
		case '"':
			i++
			for i < len(data) && data[i] != '"' {
				if data[i] == '\\' {
					i++
				}
				i++
			}
			i++
		case '{', '[':
			depth++
			i++
		case '}', ']':
			if depth == 0 { // after a literal or a number
				return i
			}
			depth--
			i++
		case ',', ':', ' ', '\t', '\n', '\r':
			if depth == 0 {
				return i
			}
			i++
			continue
		default: // a literal or a number
			i++
			continue
		}
		if depth == 0 {
			return min(i, len(data))
		}
	}
	return min(i, len(data))
}

// walkJSON calls f with each element of the array (object: false) or each
// member's key (without quotes) and value of the object (object: true)
// that data, valid JSON, holds, until f returns false; false if data is
// not such a value or f returned false. Data that is not valid JSON gives
// false or values that mean nothing, never a panic.
func walkJSON(data []byte, object bool, f func(key, value []byte) bool) bool {
	open, end := byte('['), byte(']')
	if object {
		open, end = '{', '}'
	}
	i := skipSpace(data, 0)
	if i >= len(data) || data[i] != open {
		return false
	}
	i = skipSpace(data, i+1)
	if i < len(data) && data[i] == end {
		return true
	}
	for i < len(data) {
		var key []byte
		if object {
			k := skipValue(data, i)
			if data[i] != '"' || k < i+2 {
				return false
			}
			key = data[i+1 : k-1]
			if i = skipSpace(data, k); i >= len(data) || data[i] != ':' {
				return false
			}
			i = skipSpace(data, i+1)
		}
		v := skipValue(data, i)
		if v <= i || !f(key, data[i:v]) {
			return false
		}
		if i = skipSpace(data, v); i >= len(data) {
			return false
		}
		if data[i] == end {
			return true
		}
		if data[i] != ',' {
			return false
		}
		i = skipSpace(data, i+1)
	}
	return false
}

// plainString is the text of a JSON string value without escapes, in
// UTF-8 (encoding/json would replace the bytes that are not), with false
// for any other value.
func plainString(v []byte) ([]byte, bool) {
	if len(v) < 2 || v[0] != '"' || bytes.IndexByte(v, '\\') >= 0 || !utf8.Valid(v) {
		return nil, false
	}
	return v[1 : len(v)-1], true
}

// knownKey says whether key is one of names, and whether it is not one
// but encoding/json would match it to one (another case, an escape): a
// key that is neither is skipped.
func knownKey(key []byte, names ...string) (exact, other bool) {
	for _, n := range names {
		if string(key) == n {
			return true, false
		}
	}
	if bytes.IndexByte(key, '\\') >= 0 {
		return false, true
	}
	for _, n := range names {
		if bytes.EqualFold(key, []byte(n)) {
			return false, true
		}
	}
	return false, false
}

// walkFields calls f with each member of the object data (valid JSON)
// whose key is one of fields exactly, until f returns false; false also
// when a key is one that encoding/json would match to a field otherwise
// (knownKey), which is then encoding/json's to decode. Other keys are
// skipped.
func walkFields(data []byte, fields []string, f func(key, value []byte) bool) bool {
	return walkJSON(data, true, func(key, v []byte) bool {
		exact, other := knownKey(key, fields...)
		if other {
			return false
		}
		return !exact || f(key, v)
	})
}

// walkParams is walkFields for a query's params, where a key that is
// none of fields is not skipped but refused (false): encoding/json's
// path then names it (checkParamKeys).
func walkParams(data []byte, fields []string, f func(key, value []byte) bool) bool {
	return walkJSON(data, true, func(key, v []byte) bool {
		if exact, _ := knownKey(key, fields...); !exact {
			return false
		}
		return f(key, v)
	})
}

// queryText is the string of a query's field: the usual values without
// allocating.
func queryText(b []byte) string {
	switch string(b) {
	case "device":
		return "device"
	case "message":
		return "message"
	case "quantity":
		return "quantity"
	case "agg":
		return "agg"
	case "properties":
		return "properties"
	case "history":
		return "history"
	case "g":
		return "g"
	}
	return string(b)
}

var queryFields = []string{"dashboard", "object", "measurement", "dimension", "group", "params"}

// decodeQueriesFast is json.Unmarshal of body, valid JSON, into a
// []Query, when it can tell that is what encoding/json decodes;
// false: ask encoding/json. Params alias body.
func decodeQueriesFast(body []byte) ([]Query, bool) {
	var qs []Query
	ok := walkJSON(body, false, func(_, elem []byte) bool {
		var q Query
		ok := walkFields(elem, queryFields, func(key, v []byte) bool {
			if string(key) == "params" {
				q.Params = json.RawMessage(v)
				return true
			}
			s, ok := plainString(v)
			if !ok {
				return false
			}
			switch string(key) {
			case "dashboard":
				q.Dashboard = queryText(s)
			case "object":
				q.Object = queryText(s)
			case "measurement":
				q.Measurement = queryText(s)
			case "dimension":
				q.Dimension = queryText(s)
			case "group":
				q.Group = queryText(s)
			}
			return true
		})
		qs = append(qs, q)
		return ok
	})
	if !ok {
		return nil, false
	}
	if qs == nil {
		qs = []Query{}
	}
	return qs, true
}

var countParamFields = []string{"productId", "time", "format", "limit", "from", "to"}

var historyParamFields = []string{"deviceId", "history", "properties", "from", "to"}

// decodeCountParamsFast is json.Unmarshal of a message-count query's
// params, valid JSON, into its aggParams and bucketParams, when it can
// tell that is what encoding/json decodes (as decodeQueriesFast); false:
// ask encoding/json. From and To alias raw.
func decodeCountParamsFast(raw []byte, p *aggParams, bp *bucketParams, limit *int) bool {
	if len(raw) == 0 || string(raw) == "null" {
		return true
	}
	return walkParams(raw, countParamFields, func(key, v []byte) bool {
		if string(key) == "productId" {
			s, ok := plainString(v)
			p.ProductID = string(s)
			return ok
		}
		return decodeBucketParam(key, v, bp, limit)
	})
}

var propAggParamFields = []string{"deviceId", "properties", "agg", "time", "format", "limit", "from", "to"}

// decodePropAggParamsFast is json.Unmarshal of a property aggregate
// query's params, valid JSON, into its propAggParams and its
// bucketParams, when it can tell that is what encoding/json decodes (as
// decodeQueriesFast; properties only as an array of strings without
// escapes); false: ask encoding/json. From and To alias raw.
func decodePropAggParamsFast(raw []byte, p *propAggParams, bp *bucketParams, limit *int) bool {
	if len(raw) == 0 || string(raw) == "null" {
		return true
	}
	return walkParams(raw, propAggParamFields, func(key, v []byte) bool {
		switch string(key) {
		case "properties":
			props := []string{}
			ok := walkJSON(v, false, func(_, elem []byte) bool {
				s, ok := plainString(elem)
				props = append(props, string(s))
				return ok
			})
			p.Properties = props
			return ok
		case "deviceId", "agg":
			s, ok := plainString(v)
			if string(key) == "agg" {
				p.Agg = queryText(s)
			} else {
				p.DeviceID = string(s)
			}
			return ok
		}
		return decodeBucketParam(key, v, bp, limit)
	})
}

// decodeBucketParam decodes the member key: v of a query's params, key
// being time, format, limit, from or to, into bp as encoding/json does,
// when it can tell that is what encoding/json decodes; from and to alias
// v, the limit is held in limit.
func decodeBucketParam(key, v []byte, bp *bucketParams, limit *int) bool {
	switch string(key) {
	case "from":
		bp.From = json.RawMessage(v)
		return true
	case "to":
		bp.To = json.RawMessage(v)
		return true
	case "limit":
		n, ok := epochMillis(v) // an integer as json reads one
		if !ok || int64(int(n)) != n {
			return false
		}
		*limit = int(n)
		bp.Limit = limit
		return true
	}
	s, ok := plainString(v)
	if !ok {
		return false
	}
	switch string(key) {
	case "time":
		bp.Time = string(s)
	case "format":
		bp.Format = string(s)
	}
	return true
}
