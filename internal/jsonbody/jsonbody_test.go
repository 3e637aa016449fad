package jsonbody

import (
	"net/http"
	"strings"
	"testing"
)

func TestCheck(t *testing.T) {
	for _, c := range []struct {
		ctype []string
		ok    bool
	}{
		{[]string{"application/json"}, true},
		{[]string{"application/json; charset=utf-8"}, true},
		{[]string{"Application/JSON; Charset=UTF-8"}, true},
		{nil, false},
		{[]string{""}, false},
		{[]string{"text/plain"}, false},
		{[]string{"application/x-www-form-urlencoded"}, false},
		{[]string{"multipart/form-data; boundary=x"}, false},
		{[]string{"application/json; charset=latin1"}, false},
		{[]string{"application/json; boundary=x"}, false},
		{[]string{"application/json;;"}, false},
		{[]string{"application/jsonx"}, false},
		{[]string{"application/json", "application/json"}, false},
	} {
		h := http.Header{}
		for _, v := range c.ctype {
			h.Add("Content-Type", v)
		}
		err := Check(h)
		if (err == nil) != c.ok {
			t.Errorf("%q: %v, want ok %v", c.ctype, err, c.ok)
		}
		if err != nil && (strings.Contains(err.Error(), "\n") || !strings.Contains(err.Error(), "application/json")) {
			t.Errorf("%q: %q is not one line naming application/json", c.ctype, err)
		}
	}
}
