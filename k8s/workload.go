package k8s

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"

	"github.com/memplan/memplan/internal/boundedio"
	"github.com/memplan/memplan/internal/yamlerr"
	"github.com/memplan/memplan/models"
	"github.com/memplan/memplan/pack"
	"github.com/memplan/memplan/recipe"
	"github.com/memplan/memplan/snapshot"
)

const (
	// WorkloadAnnotation holds a pod's job (pack's job vocabulary, no name).
	WorkloadAnnotation = "memplan.io/workload"
	// GPUAnnotation pins a running pod to one GPU of its node (0-based), as
	// a device plugin that assigns GPUs records it.
	GPUAnnotation = "memplan.io/gpu"
	// maxAnnotation bounds the annotation (Kubernetes bounds all of a pod's
	// annotations to 256 KiB together: apimachinery's
	// TotalAnnotationSizeLimitB).
	maxAnnotation = 256 << 10
	// maxRef bounds a plan file an annotation names; a snapshot may be
	// larger.
	maxRef, maxSnapshotRef = 16 << 20, 1 << 30
)

// ErrWorkload wraps every problem with a workload annotation.
var ErrWorkload = errors.New("bad workload annotation")

type workloadError struct{ msg string }

func (e *workloadError) Error() string { return e.msg }
func (e *workloadError) Unwrap() error { return ErrWorkload }

func badWorkload(pod, format string, a ...any) error {
	return &workloadError{fmt.Sprintf("pod %s: annotation %s: %s", pod, WorkloadAnnotation, fmt.Sprintf(format, a...))}
}

// ParseWorkload reads the annotation value of pod (namespace/name) into a
// job named after the pod, strictly as pack reads a job file. A plan: or
// snapshot: it names is read from under refs ("" refuses them); the path
// must stay inside refs. A model: or recipe: must be a catalog name
// (catalogOnly): nothing else of the disk is read.
func ParseWorkload(value, pod, refs string) (*Workload, error) {
	if strings.TrimSpace(value) == "" {
		return nil, badWorkload(pod, "empty")
	}
	if len(value) > maxAnnotation {
		return nil, badWorkload(pod, "longer than %d bytes", maxAnnotation)
	}
	// Aliases may expand the annotation to what an annotation may hold:
	// 5,000 aliases of a string took the extender to 3.7 GB.
	js, err := yamlerr.ToJSON([]byte(value), maxAnnotation, false)
	if errors.Is(err, yamlerr.ErrRefused) {
		return nil, badWorkload(pod, "%s", err)
	}
	if err != nil {
		return nil, badWorkload(pod, "not YAML or JSON: %s", yamlerr.Message(err))
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(js, &obj); err != nil || obj == nil {
		return nil, badWorkload(pod, "want a mapping such as {train: {model: gpt2, micro-batch: 8}}")
	}
	if _, ok := obj["name"]; ok {
		return nil, badWorkload(pod, "name is the pod's; leave it out")
	}
	if _, ok := obj["replicas"]; ok {
		return nil, badWorkload(pod, "replicas: a pod is one process; use a Deployment's replicas")
	}
	if err := catalogOnly(obj); err != nil {
		return nil, badWorkload(pod, "%v", err)
	}
	obj["name"], _ = json.Marshal(pod)
	file, _ := json.Marshal(map[string]any{"kind": pack.Kind, "jobs": []any{obj}})
	f, err := pack.Parse(file, "annotation")
	if err != nil {
		msg := oneLine(err.Error())
		msg = strings.TrimPrefix(msg, fmt.Sprintf("annotation: job %q: ", pod))
		msg = strings.TrimPrefix(msg, "annotation: ")
		// The annotation is the file's only job: its keys' path starts
		// at the job.
		msg = strings.TrimPrefix(msg, "jobs[0]: ")
		msg = strings.Replace(msg, "jobs[0].", "", 1)
		return nil, badWorkload(pod, "%s", msg)
	}
	j := &f.Jobs[0]
	var ref []byte
	if j.Published != "" {
		return nil, badWorkload(pod, "a published row is for job files; give the job as train or serve")
	}
	switch {
	case j.Plan != "":
		data, err := readRef(refs, j.Plan, maxRef)
		if err != nil {
			return nil, badWorkload(pod, "plan %s: %v", j.Plan, err)
		}
		ref = data
		if err := j.SetPlan(data); err != nil {
			return nil, badWorkload(pod, "plan %s: %s", j.Plan, oneLine(err.Error()))
		}
	case j.Snapshot != "":
		data, err := readRef(refs, j.Snapshot, maxSnapshotRef)
		if err != nil {
			return nil, badWorkload(pod, "snapshot %s: %v", j.Snapshot, err)
		}
		ref = data
		s, err := snapshot.Parse(data)
		if err != nil {
			return nil, badWorkload(pod, "snapshot %s: %s", j.Snapshot, oneLine(err.Error()))
		}
		j.SetSnapshot(s)
	}
	return &Workload{Job: j, key: jobKey(j, ref)}, nil
}

// catalogOnly refuses a train: or serve: job whose model is not a catalog
// model or whose recipe is not an embedded one, before pack reads them: a
// model or recipe that is not one is read as a file (models.Resolve,
// recipe.Load), and the annotation is written by whoever creates pods while
// the disk is the scheduler's (a config.json path read /etc/passwd and said
// so). Confining them to --refs as plan: and snapshot: are was the other
// way; it is not taken because a plan under --refs already carries a model
// of one's own (memplan plan --model config.json --json), and a config
// named by path would key the envelope cache by its name, not its bytes
// (jobKey hashes a plan's bytes).
// Only the strings are looked at, so the answer says nothing of the disk.
func catalogOnly(obj map[string]json.RawMessage) error {
	for _, part := range []string{"train", "serve"} {
		var job map[string]json.RawMessage
		if json.Unmarshal(obj[part], &job) != nil {
			continue // pack says what is wrong with it
		}
		var model, rec string
		if json.Unmarshal(job["model"], &model) == nil && model != "" {
			if _, err := models.Lookup(model); err != nil {
				hint := ""
				if !strings.ContainsAny(model, `/\`) && !strings.HasSuffix(strings.ToLower(model), ".json") {
					hint = "; did you mean " + strings.Join(models.Suggest(model, 3), ", ") + "?"
				}
				return fmt.Errorf("%s.model %.60q: the extender plans catalog models (memplan models lists them), not config.json files%s; for a model of your own, give the plan key a plan JSON under the extender's --refs (memplan plan --json writes one)", part, model, hint)
			}
		}
		if json.Unmarshal(job["recipe"], &rec) == nil && rec != "" && !slices.Contains(recipe.Names(), rec) {
			return fmt.Errorf("%s.recipe %.60q: the extender takes the recipes memplan recipes lists (%s), not recipe files", part, rec, strings.Join(recipe.Names(), ", "))
		}
	}
	return nil
}

// Workload is a pod's job and its identity for the envelope cache.
type Workload struct {
	Job *pack.Job
	key string
}

// readRef reads name under dir, refusing paths that leave it.
func readRef(dir, name string, limit int64) ([]byte, error) {
	if dir == "" {
		return nil, errors.New("no reference directory (the extender's --refs) to read it from")
	}
	if filepath.IsAbs(name) || !filepath.IsLocal(name) {
		return nil, errors.New("must be a relative path inside the reference directory")
	}
	// boundedio refuses a named pipe (it blocked the extender at start-up)
	// or a device (/dev/zero was read to the limit) without reading it.
	p := filepath.Join(dir, name)
	data, err := boundedio.ReadFile(p, limit)
	if err != nil {
		return nil, errors.New(strings.TrimPrefix(err.Error(), "cannot read "+p+": "))
	}
	return data, nil
}

// jobKey is a job's identity for the envelope cache: its JSON without the
// name, with the digest of the plan or snapshot it names.
func jobKey(j *pack.Job, ref []byte) string {
	c := *j
	c.Name = ""
	b, _ := json.Marshal(&c)
	sum := sha256.Sum256(ref)
	return string(b) + "#" + hex.EncodeToString(sum[:])
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }
