package k8s

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/memplan/memplan/internal/yamlerr"
)

// APIServer lists the pods bound to nodes from the Kubernetes API (GET
// /api/v1/pods with a field selector), as the pod's service account.
type APIServer struct {
	Base   string // https://host:port
	Token  string
	Client *http.Client
}

// In-cluster credentials, where the kubelet mounts a service account's
// (k8s.io/client-go rest.InClusterConfig reads the same).
const (
	saToken = "/var/run/secrets/kubernetes.io/serviceaccount/token"
	saCA    = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt"
)

// ErrNotInCluster: the process runs outside a Kubernetes pod, so there is
// no API server to list pods from.
var ErrNotInCluster = errors.New("not in a cluster (KUBERNETES_SERVICE_HOST/PORT unset)")

// InCluster is the API server of the cluster the extender runs in.
func InCluster() (*APIServer, error) {
	host, port := os.Getenv("KUBERNETES_SERVICE_HOST"), os.Getenv("KUBERNETES_SERVICE_PORT")
	if host == "" || port == "" {
		return nil, ErrNotInCluster
	}
	tok, err := os.ReadFile(saToken)
	if err != nil {
		return nil, fmt.Errorf("service account token: %w", err)
	}
	ca, err := os.ReadFile(saCA)
	if err != nil {
		return nil, fmt.Errorf("service account CA: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca) {
		return nil, errors.New("service account CA: no certificate")
	}
	return &APIServer{
		Base:   "https://" + net.JoinHostPort(host, port),
		Token:  strings.TrimSpace(string(tok)),
		Client: &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}},
	}, nil
}

// maxPodList bounds one list answer.
const maxPodList = 512 << 20

// Pods lists every pod bound to a node and not finished.
func (a *APIServer) Pods(ctx context.Context) ([]*corev1.Pod, error) {
	u := a.Base + "/api/v1/pods?fieldSelector=" + "spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed"
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	if a.Token != "" {
		req.Header.Set("Authorization", "Bearer "+a.Token)
	}
	req.Header.Set("Accept", "application/json")
	c := a.Client
	if c == nil {
		c = http.DefaultClient
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxPodList+1))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("the API server answered %s: %s", resp.Status, cut(oneLine(string(body))))
	}
	pods, err := decodePods(body)
	if err != nil {
		return nil, err
	}
	return dedupePods(pods), nil
}

// PodFile is a PodList JSON (kubectl get pods -A -o json), read once.
type PodFile struct{ pods []*corev1.Pod }

// ReadPodFile reads a PodList JSON.
func ReadPodFile(path string) (*PodFile, error) {
	data, err := readRef(filepath.Dir(path), filepath.Base(path), maxPodList)
	if err != nil {
		return nil, fmt.Errorf("%s: %v", path, err)
	}
	pods, err := decodePods(data)
	if err == nil {
		err = uniquePods(pods)
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %v", path, err)
	}
	return &PodFile{pods}, nil
}

// Pods is the file's pods.
func (f *PodFile) Pods(context.Context) ([]*corev1.Pod, error) { return f.pods, nil }

func decodePods(data []byte) ([]*corev1.Pod, error) {
	var list corev1.PodList
	if err := json.Unmarshal(data, &list); err != nil {
		return nil, fmt.Errorf("not a PodList: %s", yamlerr.Message(err))
	}
	// kubectl and the API server always write the kind; a JSON file
	// without one (a plan, a measurement) once read as zero pods.
	if list.Kind == "" {
		return nil, errors.New("no kind: not a PodList (kubectl get pods -A -o json)")
	}
	if list.Kind != "PodList" && list.Kind != "List" {
		return nil, fmt.Errorf("kind %q is not PodList", cut(list.Kind))
	}
	out := make([]*corev1.Pod, len(list.Items))
	for i := range list.Items {
		out[i] = &list.Items[i]
	}
	return out, nil
}

// podKey is a pod's identity: its UID, or namespace/name without one
// (a file written by hand). The API server keeps one object per UID and
// one per namespace/name at a time.
func podKey(p *corev1.Pod) string {
	if p.UID != "" {
		return "uid " + string(p.UID)
	}
	return "pod " + PodName(p)
}

// uniquePods refuses a PodList file that lists a pod twice (by UID, or by
// namespace/name): the API server never does, so the file was edited or
// concatenated, and counting the pod twice filled its GPU with a pod that
// is not there ("27.82 GiB left"). A file is refused, naming the repeat,
// rather than guessed at: which copy is right is its writer's to say.
func uniquePods(pods []*corev1.Pod) error {
	seen := make(map[string]int, 2*len(pods))
	for i, p := range pods {
		keys := []string{"pod " + PodName(p)}
		if p.UID != "" {
			keys = append(keys, podKey(p))
		}
		for _, k := range keys {
			if j, ok := seen[k]; ok {
				return fmt.Errorf("items[%d] is items[%d] again (%s): a pod is listed once", i, j, cut(k))
			}
			seen[k] = i
		}
	}
	return nil
}

// dedupePods keeps the first of each pod (podKey) in the API server's
// list. One list is one snapshot, so a repeat is the same pod, and it is
// counted once; refusing the list would fail every pod's scheduling over
// what the extender cannot fix.
func dedupePods(pods []*corev1.Pod) []*corev1.Pod {
	seen := make(map[string]bool, len(pods))
	out := pods[:0]
	for _, p := range pods {
		if k := podKey(p); !seen[k] {
			seen[k] = true
			out = append(out, p)
		}
	}
	return out
}
