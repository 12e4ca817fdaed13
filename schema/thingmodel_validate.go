package schema

import (
	"encoding/json"
	"regexp"
	"strconv"
	"strings"
	"unicode/utf8"
)

// MaxNameLength is the longest allowed definition name, in characters.
const MaxNameLength = 128

var idPattern = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_\-]{0,63}$`)

var valueTypeNames = keySet(TypeInt, TypeLong, TypeFloat, TypeDouble, TypeString, TypeBoolean, TypeDate,
	TypeEnum, TypeArray, TypeObject, TypeFile, TypePassword, TypeGeoPoint)

// allowedUnits maps each allowed unit of numeric types to its display symbol.
var allowedUnits = map[string]string{
	"percent":              "%",
	"count":                "",
	"turnPerSeconds":       "r/s",
	"nanometer":            "nm",
	"micron":               "μm",
	"millimeter":           "mm",
	"centimeter":           "cm",
	"meter":                "m",
	"kilometer":            "km",
	"squareMillimeter":     "mm²",
	"squareCentimeter":     "cm²",
	"squareMeter":          "m²",
	"squareKilometer":      "km²",
	"hectare":              "ha",
	"days":                 "d",
	"hour":                 "h",
	"minutes":              "min",
	"seconds":              "s",
	"milliseconds":         "ms",
	"microseconds":         "μs",
	"nanoseconds":          "ns",
	"cubicMillimeter":      "mm³",
	"cubicCentimeter":      "cm³",
	"cubicMeter":           "m³",
	"cubicKilometer":       "km³",
	"cubicMeterPerSec":     "m³/s",
	"cubicKilometerPerSec": "km³/s",
}

var (
	fileTypes       = keySet("url", "base64", "Binary")
	propertySources = keySet("device", "manual", "rule")
	propertyModes   = keySet("read", "write", "report")
)

// IsAllowedUnit reports whether unit is one of the units allowed on numeric
// value types. The empty unit is allowed too.
func IsAllowedUnit(unit string) bool {
	_, ok := allowedUnits[unit]
	return ok || unit == ""
}

// UnitSymbol returns the display symbol of an allowed unit ("" for count,
// for the empty unit and for unknown units).
func UnitSymbol(unit string) string { return allowedUnits[unit] }

// IsNumeric reports whether the type is int, long, float or double.
func (vt *ValueType) IsNumeric() bool {
	if vt == nil {
		return false
	}
	switch vt.Type {
	case TypeInt, TypeLong, TypeFloat, TypeDouble:
		return true
	}
	return false
}

func (vt *ValueType) hasScale() bool { return vt.has&hasScale != 0 || vt.Scale != 0 }

// Validate checks the rules of the thing model and returns a
// *ValidationError for the first problem found, or nil.
func (m *ThingModel) Validate() error {
	if m == nil {
		return nil
	}
	if err := checkExtra("", m.Extra); err != nil {
		return err
	}
	ids := idSet{}
	for i := range m.Properties {
		p := indexPath("properties", i)
		if err := ids.add(p, m.Properties[i].ID); err != nil {
			return err
		}
		if err := m.Properties[i].validate(p, 1); err != nil {
			return err
		}
	}
	ids = idSet{}
	for i := range m.Events {
		p := indexPath("events", i)
		if err := ids.add(p, m.Events[i].ID); err != nil {
			return err
		}
		if err := m.Events[i].validate(p); err != nil {
			return err
		}
	}
	ids = idSet{}
	for i := range m.Functions {
		p := indexPath("functions", i)
		if err := ids.add(p, m.Functions[i].ID); err != nil {
			return err
		}
		if err := m.Functions[i].validate(p); err != nil {
			return err
		}
	}
	ids = idSet{}
	for i := range m.Tags {
		p := indexPath("tags", i)
		if err := ids.add(p, m.Tags[i].ID); err != nil {
			return err
		}
		if err := m.Tags[i].validate(p); err != nil {
			return err
		}
	}
	return nil
}

// idSet checks identifiers and their uniqueness within one list.
type idSet map[string]string

func (s idSet) add(path, id string) error {
	idPath := joinPath(path, "id")
	if id == "" {
		return vErr(idPath, "required")
	}
	if !idPattern.MatchString(id) {
		return vErr(idPath, "must match "+idPattern.String())
	}
	if prev, ok := s[id]; ok {
		return vErr(idPath, "duplicate id "+strconv.Quote(id)+" (also at "+prev+")")
	}
	s[id] = path
	return nil
}

func validateName(path, name string) error {
	if name == "" {
		return vErr(joinPath(path, "name"), "required")
	}
	if utf8.RuneCountInString(name) > MaxNameLength {
		return vErr(joinPath(path, "name"), "must be at most "+strconv.Itoa(MaxNameLength)+" characters")
	}
	return nil
}

func checkExtra(path string, extra map[string]json.RawMessage) error {
	for k, v := range extra {
		if !json.Valid(v) {
			return vErr(joinPath(path, k), "invalid JSON")
		}
	}
	return nil
}

// validate checks a property whose id was already checked; its valueType is
// at the given depth.
func (p *Property) validate(path string, depth int) error {
	if err := validateName(path, p.Name); err != nil {
		return err
	}
	if err := p.ValueType.validate(joinPath(path, "valueType"), depth); err != nil {
		return err
	}
	if err := p.Expands.validate(joinPath(path, "expands"), true); err != nil {
		return err
	}
	return checkExtra(path, p.Extra)
}

func (x *PropertyExpands) validate(path string, strict bool) error {
	if strict {
		if (x.has&hasSource != 0 || x.Source != "") && !propertySources[x.Source] {
			return vErr(joinPath(path, "source"), "must be one of device, manual, rule")
		}
	}
	seen := map[string]bool{}
	for i, t := range x.Type {
		p := indexPath(joinPath(path, "type"), i)
		if strict && !propertyModes[t] {
			return vErr(p, "must be one of read, write, report")
		}
		if seen[t] {
			return vErr(p, "duplicate "+strconv.Quote(t))
		}
		seen[t] = true
	}
	for i, m := range x.Metrics {
		if !json.Valid(m) {
			return vErr(indexPath(joinPath(path, "metrics"), i), "invalid JSON")
		}
	}
	return checkExtra(path, x.Extra)
}

func (e *Event) validate(path string) error {
	if err := validateName(path, e.Name); err != nil {
		return err
	}
	if err := e.ValueType.validate(joinPath(path, "valueType"), 1); err != nil {
		return err
	}
	xp := joinPath(path, "expands")
	if e.Expands.has&hasLevel != 0 && strings.TrimSpace(e.Expands.Level) == "" {
		return vErr(joinPath(xp, "level"), "must not be empty")
	}
	if err := checkExtra(xp, e.Expands.Extra); err != nil {
		return err
	}
	return checkExtra(path, e.Extra)
}

func (fn *Function) validate(path string) error {
	if err := validateName(path, fn.Name); err != nil {
		return err
	}
	ids := idSet{}
	for i := range fn.Inputs {
		p := indexPath(joinPath(path, "inputs"), i)
		if err := ids.add(p, fn.Inputs[i].ID); err != nil {
			return err
		}
		if err := fn.Inputs[i].validate(p, 1); err != nil {
			return err
		}
	}
	if fn.Output != nil {
		if err := fn.Output.validate(joinPath(path, "output"), 1); err != nil {
			return err
		}
	}
	return checkExtra(path, fn.Extra)
}

func (t *Tag) validate(path string) error {
	if err := validateName(path, t.Name); err != nil {
		return err
	}
	if err := t.ValueType.validate(joinPath(path, "valueType"), 1); err != nil {
		return err
	}
	if err := t.Expands.validate(joinPath(path, "expands"), false); err != nil {
		return err
	}
	return checkExtra(path, t.Extra)
}

func (vt *ValueType) validate(path string, depth int) error {
	if depth > MaxNestingDepth {
		return depthError(path)
	}
	sub := func(key string) string { return joinPath(path, key) }
	switch {
	case vt.Type == "":
		return vErr(sub("type"), "required")
	case !valueTypeNames[vt.Type]:
		return vErr(sub("type"), "unknown type "+strconv.Quote(vt.Type))
	}
	if vt.Unit != "" {
		if !vt.IsNumeric() {
			return vErr(sub("unit"), "only allowed for int, long, float and double")
		}
		if _, ok := allowedUnits[vt.Unit]; !ok {
			return vErr(sub("unit"), "unknown unit "+strconv.Quote(vt.Unit))
		}
	}
	if vt.hasScale() {
		if vt.Type != TypeFloat && vt.Type != TypeDouble {
			return vErr(sub("scale"), "only allowed for float and double")
		}
		if vt.Scale < 0 || vt.Scale > 10 {
			return vErr(sub("scale"), "must be between 0 and 10")
		}
	}
	xp := sub("expands")
	if (vt.Expands.has&hasMaxLength != 0 || vt.Expands.MaxLength != 0) && vt.Expands.MaxLength < 1 {
		return vErr(joinPath(xp, "maxLength"), "must be at least 1")
	}
	if err := checkExtra(xp, vt.Expands.Extra); err != nil {
		return err
	}

	if vt.Type == TypeEnum && len(vt.Elements) == 0 {
		return vErr(sub("elements"), "enum needs at least one element")
	}
	values := map[string]int{}
	for i := range vt.Elements {
		el := &vt.Elements[i]
		ep := indexPath(sub("elements"), i)
		v := el.ValueString()
		if v == "" {
			return vErr(joinPath(ep, "value"), "required")
		}
		if prev, ok := values[v]; ok {
			return vErr(joinPath(ep, "value"), "duplicate value "+strconv.Quote(v)+" (also at elements["+strconv.Itoa(prev)+"])")
		}
		values[v] = i
		if err := checkExtra(ep, el.Extra); err != nil {
			return err
		}
	}

	if vt.ElementType != nil {
		if err := vt.ElementType.validate(sub("elementType"), depth+1); err != nil {
			return err
		}
	} else if vt.Type == TypeArray {
		return vErr(sub("elementType"), "required for array")
	}

	if vt.Properties == nil && vt.Type == TypeObject {
		return vErr(sub("properties"), "required for object")
	}
	ids := idSet{}
	for i := range vt.Properties {
		p := indexPath(sub("properties"), i)
		if err := ids.add(p, vt.Properties[i].ID); err != nil {
			return err
		}
		if err := vt.Properties[i].validate(p, depth+1); err != nil {
			return err
		}
	}

	if vt.Type == TypeFile || vt.has&hasFileType != 0 || vt.FileType != "" {
		if vt.FileType == "" && vt.Type == TypeFile {
			return vErr(sub("fileType"), "required for file")
		}
		if !fileTypes[vt.FileType] {
			return vErr(sub("fileType"), "must be one of url, base64, Binary")
		}
	}

	if vt.TrueValue != nil || vt.FalseValue != nil {
		if vt.TrueValue != nil && !isScalar(vt.TrueValue) {
			return vErr(sub("trueValue"), "must be a string, number or boolean")
		}
		if vt.FalseValue != nil && !isScalar(vt.FalseValue) {
			return vErr(sub("falseValue"), "must be a string, number or boolean")
		}
		if vt.TrueValue != nil && vt.FalseValue != nil && scalarText(vt.TrueValue) == scalarText(vt.FalseValue) {
			return vErr(sub("falseValue"), "must differ from trueValue")
		}
	}
	return checkExtra(path, vt.Extra)
}

// isScalar reports whether raw is a JSON string, number or boolean.
func isScalar(raw json.RawMessage) bool {
	var v any
	if err := json.Unmarshal(raw, &v); err != nil {
		return false
	}
	switch v.(type) {
	case string, float64, bool:
		return true
	}
	return false
}

// scalarText returns the text of a JSON scalar: the content of a string,
// the literal of a number or boolean, "" for nothing or null.
func scalarText(raw json.RawMessage) string {
	if len(raw) == 0 {
		return ""
	}
	if raw[0] == '"' {
		var s string
		if json.Unmarshal(raw, &s) == nil {
			return s
		}
	}
	s := strings.TrimSpace(string(raw))
	if s == "null" {
		return ""
	}
	return s
}
