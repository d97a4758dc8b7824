package zititest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// HostSchemaEnv overrides where the host.v1 JSON Schema is read from.
// Without it, HostSchemaPath looks for host.v1.schema.json next to
// management.yml.
const HostSchemaEnv = "VIPKIT_ZITI_HOST_SCHEMA"

// HostSchemaPath returns the path of host.v1.schema.json.
func HostSchemaPath() (string, error) {
	if p := os.Getenv(HostSchemaEnv); p != "" {
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("%w: %s=%s: %v", ErrNoSpec, HostSchemaEnv, p, err)
		}
		return p, nil
	}
	sp, err := SpecPath()
	if err != nil {
		return "", err
	}
	p := filepath.Join(filepath.Dir(sp), "host.v1.schema.json")
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("%w: %s (set %s)", ErrNoSpec, p, HostSchemaEnv)
	}
	return p, nil
}

// ConfigSchema is a config type's JSON Schema, compiled.
type ConfigSchema struct {
	Raw    map[string]any // the document, as the config type's schema field
	schema *jsonschema.Schema
}

// Validate checks config data against the schema. The error names every
// violation, as the controller's cause does.
func (s *ConfigSchema) Validate(data map[string]any) error {
	b, err := json.Marshal(data)
	if err != nil {
		return err
	}
	inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(b))
	if err != nil {
		return err
	}
	return s.schema.Validate(inst)
}

var (
	hostSchemaOnce sync.Once
	hostSchema     *ConfigSchema
	hostSchemaErr  error
)

// LoadHostSchema loads and compiles host.v1.schema.json once per process,
// as a draft 7 schema with format assertions on. One format is relaxed to
// the controller's behaviour: "idn-hostname" (host.v1's address) also
// takes an IP literal, IPv6 included, since the controller's validator
// does not judge that format and tunnelers host IPv6 targets.
func LoadHostSchema() (*ConfigSchema, error) {
	hostSchemaOnce.Do(func() { hostSchema, hostSchemaErr = loadHostSchema() })
	return hostSchema, hostSchemaErr
}

func loadHostSchema() (*ConfigSchema, error) {
	p, err := HostSchemaPath()
	if err != nil {
		return nil, err
	}
	b, err := os.ReadFile(p)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrNoSpec, err)
	}
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(b))
	if err != nil {
		return nil, fmt.Errorf("zititest: parse %s: %w", p, err)
	}
	var raw map[string]any
	if err := json.Unmarshal(b, &raw); err != nil {
		return nil, fmt.Errorf("zititest: parse %s: %w", p, err)
	}
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft7)
	c.AssertFormat()
	c.RegisterFormat(&jsonschema.Format{Name: "idn-hostname", Validate: hostOrIP})
	const url = "file:///host.v1.schema.json"
	if err := c.AddResource(url, doc); err != nil {
		return nil, fmt.Errorf("zititest: %s: %w", p, err)
	}
	sch, err := c.Compile(url)
	if err != nil {
		return nil, fmt.Errorf("zititest: compile %s: %w", p, err)
	}
	return &ConfigSchema{Raw: raw, schema: sch}, nil
}

// hostOrIP accepts an IP literal or a DNS name of labels up to 63
// characters (letters, digits, '-', '_' and non-ASCII letters).
func hostOrIP(v any) error {
	s, ok := v.(string)
	if !ok {
		return nil
	}
	if net.ParseIP(s) != nil {
		return nil
	}
	if len(s) > 253 {
		return fmt.Errorf("longer than 253 characters")
	}
	label := 0
	for _, r := range s {
		switch {
		case r == '.':
			if label == 0 {
				return fmt.Errorf("empty label")
			}
			label = 0
		case r == '-' || r == '_' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r > 127:
			label++
			if label > 63 {
				return fmt.Errorf("label longer than 63 characters")
			}
		default:
			return fmt.Errorf("character %q is not allowed in a host name", r)
		}
	}
	return nil
}
