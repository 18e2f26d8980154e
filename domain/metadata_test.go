package domain

import (
	"errors"
	"strings"
	"testing"
)

func TestNewMetadata(t *testing.T) {
	m, err := NewMetadata([]byte(" { \"tenant\" : \"t1\" } "), []string{"a", "b", "a"})
	if err != nil || string(m.Object) != `{"tenant":"t1"}` || strings.Join(m.Tags, ",") != "a,b" {
		t.Fatalf("%s %q %v", m.Object, m.Tags, err)
	}
	if m, err := NewMetadata(nil, nil); err != nil || string(m.Object) != "{}" || m.Tags != nil {
		t.Errorf("empty: %s %q %v", m.Object, m.Tags, err)
	}
	big := `{"x":"` + strings.Repeat("a", MaxMetadataBytes) + `"}`
	fits := `{"x":"` + strings.Repeat("a", MaxMetadataBytes-8) + `"}`
	many := make([]string, MaxTags+1)
	for i := range many {
		many[i] = "t" + strings.Repeat("x", i)
	}
	for _, bad := range []struct {
		object string
		tags   []string
	}{
		{`{"a":`, nil}, {`[1]`, nil}, {`"s"`, nil}, {`null`, nil}, {big, nil},
		{``, []string{""}}, {``, []string{"-a"}}, {``, []string{"a b"}}, {``, []string{strings.Repeat("a", MaxTagLength+1)}},
		{``, many}, {`{"a":"x\u0000y"}`, nil}, {`{"a\u0000":1}`, nil}, {`{"a":[{"b":"\u0000"}]}`, nil},
	} {
		if _, err := NewMetadata([]byte(bad.object), bad.tags); !errors.Is(err, ErrInvalidMetadata) {
			t.Errorf("%.30s %.3q: %v, want ErrInvalidMetadata", bad.object, bad.tags, err)
		} else if strings.Contains(err.Error(), "aaaa") {
			t.Errorf("the error quotes the input: %v", err)
		}
	}
	// A backslash before u0000 is text, not a NUL.
	if _, err := NewMetadata([]byte(`{"a":"\\u0000"}`), nil); err != nil {
		t.Errorf("an escaped backslash before u0000: %v", err)
	}
	if _, err := NewMetadata([]byte(fits), many[:MaxTags]); err != nil {
		t.Errorf("at the bounds: %v", err)
	}
}
