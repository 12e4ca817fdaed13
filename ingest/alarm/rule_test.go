package alarm

import (
	"encoding/json"
	"errors"
	"testing"

	"devicehub/schema"
)

const testModel = `{
 "properties": [
  {"id":"temp","name":"Temperature","valueType":{"type":"float","scale":1}},
  {"id":"limit","name":"Limit","valueType":{"type":"float"}},
  {"id":"mode","name":"Mode","valueType":{"type":"enum","elements":[{"value":"auto","text":"Auto"},{"value":"manual","text":"Manual"}]}},
  {"id":"on","name":"On","valueType":{"type":"boolean","trueValue":"1","falseValue":"0"}},
  {"id":"label","name":"Label","valueType":{"type":"string"}},
  {"id":"pos","name":"Position","valueType":{"type":"geoPoint"}}
 ],
 "events": [
  {"id":"fault","name":"Fault","valueType":{"type":"object","properties":[
    {"id":"code","name":"Code","valueType":{"type":"int"}},
    {"id":"text","name":"Text","valueType":{"type":"string"}}]}},
  {"id":"boot","name":"Boot","valueType":{"type":"string"}}
 ],
 "functions": [],
 "tags": [{"id":"maxTemp","name":"Max temperature","valueType":{"type":"float"}}]
}`

func model(t testing.TB) *schema.ThingModel {
	t.Helper()
	m, err := schema.ParseThingModelString(testModel)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// TestRuleValidate: each bad rule is refused with the field it names;
// good ones pass.
func TestRuleValidate(t *testing.T) {
	m := model(t)
	f := func(body, field string) {
		t.Helper()
		r, err := ParseRule([]byte(body))
		if err == nil {
			err = r.Validate(m)
		}
		if field == "" {
			if err != nil {
				t.Errorf("%s: %v", body, err)
			}
			return
		}
		var ae *schema.ArgError
		if !errors.As(err, &ae) || !errors.Is(err, schema.ErrIllegalArgument) {
			t.Errorf("%s: got %v, want an ArgError naming %q", body, err, field)
			return
		}
		if ae.Field != field {
			t.Errorf("%s: field %q (%v), want %q", body, ae.Field, err, field)
		}
	}
	const head = `{"id":"r1","name":"Hot","productId":"p1","severity":"major",`
	// good
	f(head+`"trigger":{"type":"property","all":[{"property":"temp","op":"gt","value":30}]}}`, "")
	f(head+`"trigger":{"type":"property","any":[{"property":"temp","op":"between","value":[1,2]},{"all":[{"property":"mode","op":"eq","value":"manual"},{"property":"on","op":"eq","value":true}]}]},"clear":{"type":"condition","all":[{"property":"temp","op":"lt","value":28}]}}`, "")
	f(head+`"trigger":{"type":"property","all":[{"property":"temp","op":"gt","ref":"tag.maxTemp","value":50}]},"duration":"30s"}`, "")
	f(head+`"trigger":{"type":"property","all":[{"property":"temp","op":"gt","of":"rate","value":2}]},"repeat":{"count":3,"within":"1m"}}`, "")
	f(head+`"trigger":{"type":"property","all":[{"property":"label","op":"changed"}]}}`, "")
	f(head+`"trigger":{"type":"event","event":"fault","all":[{"property":"code","op":"ge","value":500}]},"clear":{"for":"1m"}}`, "")
	f(head+`"trigger":{"type":"offline","for":"5m"}}`, "")
	f(head+`"trigger":{"type":"nodata","for":"10m","property":"temp"},"clear":{"type":"manual"}}`, "")
	f(head+`"trigger":{"type":"property","all":[{"property":"temp","op":"gt","value":30}]},"ladder":[{"severity":"critical","all":[{"property":"temp","op":"gt","value":40}]}]}`, "")
	// bad
	f(`{"id":"r1","name":"x","productId":"p1","severity":"major","trigger":{"type":"property","all":[{"property":"temp","op":"gt","value":30}]},"treshold":3}`, "treshold")
	f(`{"id":"","name":"x","productId":"p1","severity":"major","trigger":{"type":"offline","for":"1m"}}`, "id")
	f(`{"id":"a b","name":"x","productId":"p1","severity":"major","trigger":{"type":"offline","for":"1m"}}`, "id")
	f(`{"id":"r1","name":" ","productId":"p1","severity":"major","trigger":{"type":"offline","for":"1m"}}`, "name")
	f(`{"id":"r1","name":"x","severity":"major","trigger":{"type":"offline","for":"1m"}}`, "productId")
	f(`{"id":"r1","name":"x","productId":"p1","severity":"urgent","trigger":{"type":"offline","for":"1m"}}`, "severity")
	f(`{"id":"r1","name":"x","productId":"p1","severity":"major","trigger":{"type":"offline","for":"1m"},"duration":"1x"}`, "duration")
	f(head+`"trigger":{"type":"weather"}}`, "trigger.type")
	f(head+`"trigger":{"type":"property"}}`, "trigger.all")
	f(head+`"trigger":{"type":"property","all":[{"property":"tmp","op":"gt","value":30}]}}`, "trigger.all[0].property")
	f(head+`"trigger":{"type":"property","all":[{"property":"label","op":"gt","value":30}]}}`, "trigger.all[0].op")
	f(head+`"trigger":{"type":"property","all":[{"property":"temp","op":"gt","value":"hot"}]}}`, "trigger.all[0].value")
	f(head+`"trigger":{"type":"property","all":[{"property":"temp","op":"above","value":3}]}}`, "trigger.all[0].op")
	f(head+`"trigger":{"type":"property","all":[{"property":"temp","op":"gt"}]}}`, "trigger.all[0].value")
	f(head+`"trigger":{"type":"property","all":[{"property":"mode","op":"eq","value":"turbo"}]}}`, "trigger.all[0].value")
	f(head+`"trigger":{"type":"property","all":[{"property":"on","op":"eq","value":"yes"}]}}`, "trigger.all[0].value")
	f(head+`"trigger":{"type":"property","all":[{"property":"pos","op":"eq","value":"1,2"}]}}`, "trigger.all[0].op")
	f(head+`"trigger":{"type":"property","all":[{"property":"temp","op":"between","value":[5,1]}]}}`, "trigger.all[0].value")
	f(head+`"trigger":{"type":"property","all":[{"property":"temp","op":"between","value":3}]}}`, "trigger.all[0].value")
	f(head+`"trigger":{"type":"property","all":[{"property":"label","op":"gt","of":"change","value":3}]}}`, "trigger.all[0].of")
	f(head+`"trigger":{"type":"property","all":[{"property":"temp","op":"gt","ref":"config.max"}]}}`, "")
	f(head+`"trigger":{"type":"property","all":[{"property":"temp","op":"gt","ref":"setting.max"}]}}`, "trigger.all[0].ref")
	f(head+`"trigger":{"type":"property","all":[{"property":"temp","op":"gt","ref":"config."}]}}`, "trigger.all[0].ref")
	f(head+`"trigger":{"type":"property","any":[{"all":[{"any":[{"property":"temp","op":"gt","value":1}]}]}]}}`, "trigger.any[0].all[0]")
	f(head+`"trigger":{"type":"property","all":[{"property":"temp","op":"gt","value":1}],"any":[{"property":"temp","op":"gt","value":1}]}}`, "trigger.any")
	f(head+`"trigger":{"type":"event","event":"reboot"}}`, "trigger.event")
	f(head+`"trigger":{"type":"event","event":"boot","all":[{"property":"code","op":"gt","value":1}]},"clear":{"for":"1m"}}`, "trigger.all")
	f(head+`"trigger":{"type":"event","event":"fault","all":[{"property":"temp","op":"gt","value":1}]},"clear":{"for":"1m"}}`, "trigger.all[0].property")
	f(head+`"trigger":{"type":"event","event":"fault","all":[{"property":"code","op":"changed"}]},"clear":{"for":"1m"}}`, "trigger.all[0].op")
	f(head+`"trigger":{"type":"event","event":"fault"}}`, "clear.for")
	f(head+`"trigger":{"type":"offline"}}`, "trigger.for")
	f(head+`"trigger":{"type":"offline","for":"1m","event":"fault"}}`, "trigger.event")
	f(head+`"trigger":{"type":"nodata","for":"1m","property":"speed"}}`, "trigger.property")
	f(head+`"trigger":{"type":"nodata","for":"1m"},"duration":"1m"}`, "duration")
	f(head+`"trigger":{"type":"property","all":[{"property":"temp","op":"gt","value":30}]},"duration":"1m","repeat":{"count":2,"within":"1m"}}`, "repeat")
	f(head+`"trigger":{"type":"property","all":[{"property":"temp","op":"gt","value":30}]},"repeat":{"count":0,"within":"1m"}}`, "repeat.count")
	f(head+`"trigger":{"type":"property","all":[{"property":"temp","op":"gt","value":30}]},"repeat":{"count":2}}`, "repeat.within")
	f(head+`"trigger":{"type":"property","all":[{"property":"temp","op":"gt","value":30}]},"clear":{"type":"condition"}}`, "clear.all")
	f(head+`"trigger":{"type":"offline","for":"1m"},"clear":{"type":"condition","all":[{"property":"temp","op":"lt","value":1}]}}`, "clear.type")
	f(head+`"trigger":{"type":"property","all":[{"property":"temp","op":"gt","value":30}]},"clear":{"type":"sometimes"}}`, "clear.type")
	f(head+`"trigger":{"type":"property","all":[{"property":"temp","op":"gt","value":30}]},"ladder":[{"severity":"minor","all":[{"property":"temp","op":"gt","value":40}]}]}`, "ladder[0].severity")
	f(head+`"trigger":{"type":"property","all":[{"property":"temp","op":"gt","value":30}]},"ladder":[{"severity":"critical"}]}`, "ladder[0].all")
	f(head+`"trigger":{"type":"property","all":[{"property":"temp","op":"gt","value":30}]},"ladder":[{"severity":"critical","all":[{"property":"x","op":"gt","value":40}]}]}`, "ladder[0].all[0].property")
	f(head+`"trigger":{"type":"offline","for":"1m"},"ladder":[{"severity":"critical","all":[{"property":"temp","op":"gt","value":40}]}]}`, "ladder")
	f(head+`"trigger":{"type":"property","all":[{"property":"temp","op":"gt","value":30}]},"repeat":{"count":"two","within":"1m"}}`, "repeat.count")
}

// TestRuleJSONRoundTrip: a rule written and read back is the same rule.
func TestRuleJSONRoundTrip(t *testing.T) {
	in := `{"id":"r1","name":"Hot","productId":"p1","severity":"major","enabled":true,"trigger":{"type":"property","any":[{"property":"temp","op":"gt","value":30},{"all":[{"property":"mode","op":"eq","value":"manual"}]}]},"duration":"1m30s","clear":{"type":"condition","all":[{"property":"temp","op":"lt","value":28}],"for":"10s"},"ladder":[{"severity":"critical","all":[{"property":"temp","op":"gt","value":40}]}]}`
	r, err := ParseRule([]byte(in))
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Validate(model(t)); err != nil {
		t.Fatal(err)
	}
	out, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	if string(out) != in {
		t.Errorf("round trip:\n got %s\nwant %s", out, in)
	}
	var d Duration
	if err := json.Unmarshal([]byte(`90000`), &d); err != nil || d.D().String() != "1m30s" {
		t.Errorf("milliseconds: %v %v", d.D(), err)
	}
}
