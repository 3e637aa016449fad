package server

import "strings"

// docKinds are the documents each command answers with (their "kind").
var docKinds = map[string]string{
	"plan":    "memplan.plan/v1 (or, with mode serve, the serving plan)",
	"compare": "memplan.compare/v1",
	"fit":     "memplan.fit/v1",
	"max":     "max's JSON: the answer, the plan at it and one step beyond",
	"explain": "explain's JSON: the snapshot's peaks and the live set at them",
	"pack":    "memplan.pack/v1",
}

// exitHeader is the Memplan-Exit-Status header of a response whose CLI
// exit statuses are exits.
func exitHeader(exits string) map[string]any {
	return map[string]any{"Memplan-Exit-Status": map[string]any{"schema": map[string]any{"type": "integer"},
		"description": "the CLI's exit status for the same flags: " + exits}}
}

// OpenAPI is the OpenAPI 3 document of b's API, as data: each command's
// request schema is its fields (Backend.Fields, the CLI's flags), closed to
// others.
func OpenAPI(b Backend) map[string]any {
	errResp := func(desc string) map[string]any {
		return map[string]any{"description": desc, "content": map[string]any{"application/json": map[string]any{
			"schema": map[string]any{"$ref": "#/components/schemas/Error"}}}}
	}
	busy := errResp("busy: the queue is full (429) or the wait for a place ran out, or the request ran past its time limit (503)")
	busy["headers"] = map[string]any{"Retry-After": map[string]any{"schema": map[string]any{"type": "integer"}, "description": "seconds"}}
	paths := map[string]any{}
	for _, c := range b.Commands() {
		props := map[string]any{}
		var required []string
		for _, f := range b.Fields(c) {
			p := map[string]any{"description": f.Help}
			switch {
			case f.Ask:
				p["oneOf"] = []any{map[string]any{"type": "integer"}, map[string]any{"type": "string", "enum": []any{"?"}}}
			case f.Type == "array":
				p["type"], p["items"] = "array", map[string]any{"type": "string"}
			default:
				p["type"] = f.Type
			}
			if f.Default != "" && f.Default != "[]" {
				p["description"] = f.Help + " (default " + f.Default + ")"
			}
			props[f.Key] = p
			if f.Required {
				required = append(required, f.Key)
			}
		}
		schema := map[string]any{"type": "object", "additionalProperties": false, "properties": props}
		if len(required) > 0 {
			schema["required"] = required
		}
		doc := map[string]any{"type": "object", "description": "the " + docKinds[c] + " document memplan " + c + " --json prints"}
		badInput := errResp("bad input (the CLI's exit status 1): malformed JSON, an unknown field, a value of the wrong type, or a value the command refuses; field names it")
		badInput["headers"] = exitHeader("1")
		paths["/v1/"+c] = map[string]any{"post": map[string]any{
			"operationId": c,
			"summary":     "memplan " + c + ", its flags as fields ('-' written '_')",
			"requestBody": map[string]any{"required": true, "content": map[string]any{"application/json": map[string]any{"schema": schema}}},
			"responses": map[string]any{
				"200": map[string]any{"description": "the " + docKinds[c] + " document memplan " + c + " --json prints (the CLI's exit status 0, or 3: the job does not fit, which the document says)",
					"headers": map[string]any{
						"Memplan-Exit-Status": exitHeader("0 fits (or no GPU or budget was given), 3 does not fit")["Memplan-Exit-Status"],
						"Memplan-Cache":       map[string]any{"schema": map[string]any{"type": "string", "enum": []any{"hit", "miss"}}},
					},
					"content": map[string]any{"application/json": map[string]any{"schema": doc}}},
				"400": badInput,
				"413": errResp("the request body is over the size limit"),
				"415": errResp("the request's Content-Type is not application/json (with at most charset=utf-8): other types are refused so that no page of another site can make the server compute"),
				"422": map[string]any{"description": "nothing fits (the CLI's exit status 4): compare answers its document (no strategy fits) and max its document (no value fits), each naming the largest lever; fit, which prints none, answers the error (no plan fits)",
					"headers": exitHeader("4"),
					"content": map[string]any{"application/json": map[string]any{"schema": map[string]any{
						"anyOf": []any{doc, map[string]any{"$ref": "#/components/schemas/Error"}}}}}},
				"429": busy,
				"503": busy,
			},
		}}
	}
	get := func(summary string, content string, schema map[string]any) map[string]any {
		return map[string]any{"get": map[string]any{"summary": summary, "responses": map[string]any{
			"200": map[string]any{"description": summary, "content": map[string]any{content: map[string]any{"schema": schema}}}}}}
	}
	paths["/openapi.json"] = get("this document", "application/json", map[string]any{"type": "object"})
	paths["/healthz"] = get("liveness: status ok, requests in flight, queued, and waiting aside for the heavy turn", "application/json", map[string]any{"type": "object",
		"properties": map[string]any{"status": map[string]any{"type": "string"}, "in_flight": map[string]any{"type": "integer"}, "queued": map[string]any{"type": "integer"},
			"waiting_aside": map[string]any{"type": "integer"}}})
	pagePaths(paths, b)
	paths["/metrics"] = get("Prometheus metrics (text exposition format)", "text/plain", map[string]any{"type": "string"})
	return map[string]any{
		"openapi": "3.0.3",
		"info": map[string]any{"title": "memplan", "version": "v1",
			"description": "memplan's commands (" + strings.Join(b.Commands(), ", ") + ") over HTTP: POST a JSON object of the command's flags, get the document its --json prints."},
		"paths": paths,
		"components": map[string]any{"schemas": map[string]any{"Error": map[string]any{
			"type": "object", "required": []any{"error"},
			"properties": map[string]any{
				"error": map[string]any{"type": "string", "description": "one line naming the problem in terms of request fields"},
				"field": map[string]any{"type": "string", "description": "the request field it is about, when one"},
			}}}},
	}
}
