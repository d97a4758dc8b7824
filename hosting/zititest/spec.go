package zititest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	"github.com/getkin/kin-openapi/openapi2"
	"github.com/getkin/kin-openapi/openapi2conv"
	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/gorillamux"
	"go.yaml.in/yaml/v4"
)

// SpecEnv overrides where the Edge Management API specification is read
// from. Without it, SpecPath looks for ../shared/ziti/management.yml next to
// the module root (a sibling of the repository), where CI puts it.
const SpecEnv = "VIPKIT_ZITI_SPEC"

// ErrNoSpec means the specification file cannot be found.
var ErrNoSpec = errors.New("zititest: management.yml not found")

// SpecPath returns the path of management.yml.
func SpecPath() (string, error) {
	if p := os.Getenv(SpecEnv); p != "" {
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("%w: %s=%s: %v", ErrNoSpec, SpecEnv, p, err)
		}
		return p, nil
	}
	dir, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("%w: %v", ErrNoSpec, err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			p := filepath.Join(dir, "..", "shared", "ziti", "management.yml")
			if _, err := os.Stat(p); err != nil {
				return "", fmt.Errorf("%w: %s (set %s)", ErrNoSpec, p, SpecEnv)
			}
			return p, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("%w: no module root above the working directory (set %s)", ErrNoSpec, SpecEnv)
		}
		dir = parent
	}
}

// Spec is the loaded specification: the OpenAPI 3 document converted from
// the Swagger 2.0 file, and a router on the paths after the basePath.
type Spec struct {
	Doc    *openapi3.T
	Router routers.Router
	// ValidateErr is what the document's own Validate reports; the
	// published document has one known fault (controllerSettingsList),
	// which routing and request validation tolerate.
	ValidateErr error
}

var (
	specOnce sync.Once
	spec     *Spec
	specErr  error
)

// LoadSpec loads and converts management.yml once per process (it is
// 1.3 MB) and returns the shared, read-only result.
func LoadSpec() (*Spec, error) {
	specOnce.Do(func() { spec, specErr = loadSpec() })
	return spec, specErr
}

func loadSpec() (*Spec, error) {
	p, err := SpecPath()
	if err != nil {
		return nil, err
	}
	b, err := os.ReadFile(p)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrNoSpec, err)
	}
	var raw any
	if err := yaml.Unmarshal(b, &raw); err != nil {
		return nil, fmt.Errorf("zititest: parse %s: %w", p, err)
	}
	jb, err := json.Marshal(raw)
	if err != nil {
		return nil, fmt.Errorf("zititest: parse %s: %w", p, err)
	}
	var d2 openapi2.T
	if err := json.Unmarshal(jb, &d2); err != nil {
		return nil, fmt.Errorf("zititest: parse %s: %w", p, err)
	}
	d3, err := openapi2conv.ToV3(&d2)
	if err != nil {
		return nil, fmt.Errorf("zititest: convert %s: %w", p, err)
	}
	fixTags(d3)
	s := &Spec{Doc: d3, ValidateErr: d3.Validate(context.Background())}
	// Route on the path after the basePath, whatever the host.
	d3.Servers = openapi3.Servers{{URL: "/"}}
	if s.Router, err = gorillamux.NewRouter(d3); err != nil {
		return nil, fmt.Errorf("zititest: router: %w", err)
	}
	return s, nil
}

// fixTags amends one schema of the published document. subTags declares its
// values as "type: object", go-swagger's idiom for "any value", while the
// document itself says (on tags) that "the values are limited to the
// following types/values: null, string, boolean" — which is what the
// controller enforces. Read as JSON Schema, "type: object" would refuse
// every real tag and accept the object values the controller refuses, so
// the fake checks the documented rule instead.
func fixTags(d *openapi3.T) {
	st := d.Components.Schemas["subTags"]
	if st == nil || st.Value == nil {
		return
	}
	val := &openapi3.Schema{
		Nullable: true,
		AnyOf: openapi3.SchemaRefs{
			{Value: &openapi3.Schema{Type: &openapi3.Types{openapi3.TypeString}, Nullable: true}},
			{Value: &openapi3.Schema{Type: &openapi3.Types{openapi3.TypeBoolean}, Nullable: true}},
		},
	}
	st.Value.AdditionalProperties = openapi3.AdditionalProperties{Schema: &openapi3.SchemaRef{Value: val}}
}
