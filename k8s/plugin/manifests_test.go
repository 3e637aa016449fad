package plugin

import (
	"context"
	"os"
	"reflect"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/kubernetes/pkg/scheduler/apis/config"
	"k8s.io/kubernetes/pkg/scheduler/apis/config/scheme"
	"k8s.io/kubernetes/pkg/scheduler/apis/config/validation"
	"sigs.k8s.io/yaml"
)

// decode reads a KubeSchedulerConfiguration as kube-scheduler --config
// does (its scheme, strict, defaults applied) and validates it.
func decode(t *testing.T, data []byte) *config.KubeSchedulerConfiguration {
	t.Helper()
	obj, _, err := scheme.Codecs.UniversalDecoder().Decode(data, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	cfg, ok := obj.(*config.KubeSchedulerConfiguration)
	if !ok {
		t.Fatalf("%T", obj)
	}
	if err := validation.ValidateKubeSchedulerConfiguration(cfg); err != nil {
		t.Fatal(err)
	}
	return cfg
}

func read(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// The manifests in deploy/ are what the scheduler accepts: both
// configurations decode and validate, the plugin's args build the plugin,
// and the ConfigMap the Deployment mounts holds the same profile.
func TestManifests(t *testing.T) {
	ext := decode(t, read(t, "../../deploy/extender/scheduler-config.yaml"))
	if len(ext.Extenders) != 1 || ext.Extenders[0].FilterVerb != "filter" || ext.Extenders[0].PrioritizeVerb != "prioritize" || ext.Extenders[0].NodeCacheCapable {
		t.Errorf("extender: %+v", ext.Extenders)
	}

	profile := read(t, "../../deploy/plugin/scheduler-config.yaml")
	cfg := decode(t, profile)
	if len(cfg.Profiles) != 1 || cfg.Profiles[0].SchedulerName != "memplan-scheduler" {
		t.Fatalf("profiles: %+v", cfg.Profiles)
	}
	p := cfg.Profiles[0]
	for point, set := range map[string]config.PluginSet{"filter": p.Plugins.Filter, "score": p.Plugins.Score, "reserve": p.Plugins.Reserve} {
		found := false
		for _, e := range set.Enabled {
			found = found || e.Name == Name
		}
		if !found {
			t.Errorf("%s: %s not enabled", point, Name)
		}
	}
	var args runtime.Object
	for _, pc := range p.PluginConfig {
		if pc.Name == Name {
			args = pc.Args
		}
	}
	if args == nil {
		t.Fatal("no pluginConfig for " + Name)
	}
	pl, err := New(context.Background(), args, nil)
	if err != nil {
		t.Fatal(err)
	}
	if pl.(*Plugin).planner.Margin != 1<<30 {
		t.Errorf("margin %v", pl.(*Plugin).planner.Margin)
	}

	// The Deployment's ConfigMap embeds the same configuration.
	found := false
	for _, doc := range strings.Split(string(read(t, "../../deploy/plugin/deployment.yaml")), "\n---\n") {
		var m struct {
			Kind string            `json:"kind"`
			Data map[string]string `json:"data"`
		}
		if err := yaml.Unmarshal([]byte(doc), &m); err != nil {
			t.Fatal(err)
		}
		if m.Kind == "ConfigMap" {
			found = true
			if got := decode(t, []byte(m.Data["scheduler-config.yaml"])); !reflect.DeepEqual(got, cfg) {
				t.Error("the ConfigMap's configuration differs from deploy/plugin/scheduler-config.yaml")
			}
		}
	}
	if !found {
		t.Error("no ConfigMap in deploy/plugin/deployment.yaml")
	}
}
