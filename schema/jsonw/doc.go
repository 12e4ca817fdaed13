// Package jsonw is devicehub's JSON writer: the appenders that write
// strings, floats, raw JSON values and lists exactly as encoding/json
// would, without reflection, for the encoders that write JSON by hand (the
// thing model's, the API's responses and exports, the alarm evaluator's
// state rows).
//
// Two escapings: String, Bytes, Raw and Compact write what json.Marshal
// writes (HTML characters <, >, & escaped as \u003c...); StringNoHTML and
// RawNoHTML what an Encoder with SetEscapeHTML(false) writes. Both escape
// control characters, U+2028 and U+2029, and write invalid UTF-8 as
// U+FFFD.
//
// It sits below schema, the lowest floor that writes JSON, so that every
// floor above may use it; it imports nothing of the project. It holds no
// state.
package jsonw
