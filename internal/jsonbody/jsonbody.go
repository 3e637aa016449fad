// Package jsonbody is the one rule memplan's HTTP endpoints (the service's
// /v1 commands, the Kubernetes extender's verbs) apply to a request body's
// Content-Type.
package jsonbody

import (
	"fmt"
	"mime"
	"net/http"
	"strings"
)

// Check is nil when h has one Content-Type saying the body is JSON:
// application/json, with no parameter but a UTF-8 charset (RFC 8259: JSON
// between systems is UTF-8). Otherwise it is the one-line reason to answer
// 415 with. It is what keeps other sites out: a page may send a form,
// multipart or text/plain to any origin without asking (a CORS simple
// request), but application/json only after a preflight, which neither
// endpoint grants. kube-scheduler sends its extender calls as
// application/json (pkg/scheduler/extender.go, HTTPExtender.send).
func Check(h http.Header) error {
	ct := h.Values("Content-Type")
	if len(ct) == 1 && isJSON(ct[0]) {
		return nil
	}
	return fmt.Errorf("the body must be sent as Content-Type: application/json, not %q: "+
		"other types are refused so that no page of another site can make this server compute", strings.Join(ct, ", "))
}

func isJSON(ctype string) bool {
	if ctype == "application/json" {
		return true
	}
	mt, params, err := mime.ParseMediaType(ctype)
	if err != nil || mt != "application/json" {
		return false
	}
	for k, v := range params {
		if k != "charset" || !strings.EqualFold(v, "utf-8") {
			return false
		}
	}
	return true
}
