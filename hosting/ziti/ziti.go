// Package ziti is a client for the parts of the OpenZiti Edge Management API
// (API version 0.29.0, basePath /edge/management/v1) that package hosting
// projects shares onto: configs, config types, services, service policies,
// identities and their service-config overrides, and terminators.
//
// The request and response bodies follow management.yml, the published
// specification: a create answers 201 with a createEnvelope, every error
// answers with an apiErrorEnvelope, which the client returns as *APIError.
//
// The client never retries. In particular the controller's 500 "config is in
// use by identity" (ErrConfigInUse) is an ordering fault of the caller — a
// config named by an override was deleted before the override — and a retry
// cannot fix it.
//
// The client logs in itself with a Login: updb (PasswordLogin) or the
// client certificate its HTTP client presents (CertLogin). It renews the
// session RefreshBefore ahead of its expiry, and after a 401 (a session the
// controller forgot) logs in once more and resends that request once; a
// refused login is not retried. A static Session token works too.
//
// Usage:
//
//	c, err := ziti.New("https://ctrl.example:1280", ziti.Options{Login: ziti.PasswordLogin("admin", pw)})
//	id, err := c.CreateConfig(ctx, ziti.ConfigCreate{Name: "x", ConfigTypeID: t, Data: data})
//
// A *Client is safe for concurrent use. Its zero value is not usable; make
// one with New.
package ziti

import (
	"errors"
	"fmt"
	"strings"
)

// Tags are an object's user-defined fields. The controller accepts only
// string, boolean and null values.
type Tags map[string]any

// Config is a config resource (configDetail).
type Config struct {
	ID           string         `json:"id"`
	Name         string         `json:"name"`
	ConfigTypeID string         `json:"configTypeId"`
	Data         map[string]any `json:"data"`
	Tags         Tags           `json:"tags,omitempty"`
}

// ConfigCreate is the body of createConfig (configCreate).
type ConfigCreate struct {
	Name         string         `json:"name"`
	ConfigTypeID string         `json:"configTypeId"`
	Data         map[string]any `json:"data"`
	Tags         Tags           `json:"tags,omitempty"`
}

// ConfigPatch is the body of patchConfig (configPatch). Nil fields are left
// out and so left unchanged by the controller.
type ConfigPatch struct {
	Name *string        `json:"name,omitempty"`
	Data map[string]any `json:"data,omitempty"`
	Tags Tags           `json:"tags,omitempty"`
}

// ConfigType is a config-type resource (configTypeDetail).
type ConfigType struct {
	ID   string `json:"id"`
	Name string `json:"name"`
}

// Service is a service resource (serviceDetail).
type Service struct {
	ID                 string   `json:"id"`
	Name               string   `json:"name"`
	Configs            []string `json:"configs"`
	EncryptionRequired bool     `json:"encryptionRequired"`
	TerminatorStrategy string   `json:"terminatorStrategy,omitempty"`
	Tags               Tags     `json:"tags,omitempty"`
}

// ServiceCreate is the body of createService (serviceCreate).
type ServiceCreate struct {
	Name               string   `json:"name"`
	Configs            []string `json:"configs"`
	EncryptionRequired bool     `json:"encryptionRequired"`
	TerminatorStrategy string   `json:"terminatorStrategy,omitempty"`
	Tags               Tags     `json:"tags,omitempty"`
}

// ServicePatch is the body of patchService (servicePatch). Nil fields are
// left out and so left unchanged by the controller.
type ServicePatch struct {
	Name    *string   `json:"name,omitempty"`
	Configs *[]string `json:"configs,omitempty"`
	Tags    Tags      `json:"tags,omitempty"`
}

// Policy types and semantics (dialBind, semantic).
const (
	PolicyBind = "Bind"
	PolicyDial = "Dial"
	AnyOf      = "AnyOf"
	AllOf      = "AllOf"
)

// ServicePolicy is a service-policy resource (servicePolicyDetail).
type ServicePolicy struct {
	ID            string   `json:"id"`
	Name          string   `json:"name"`
	Type          string   `json:"type"`
	Semantic      string   `json:"semantic"`
	ServiceRoles  []string `json:"serviceRoles"`
	IdentityRoles []string `json:"identityRoles"`
	Tags          Tags     `json:"tags,omitempty"`
}

// ServicePolicyCreate is the body of createServicePolicy.
type ServicePolicyCreate struct {
	Name          string   `json:"name"`
	Type          string   `json:"type"`
	Semantic      string   `json:"semantic"`
	ServiceRoles  []string `json:"serviceRoles"`
	IdentityRoles []string `json:"identityRoles"`
	Tags          Tags     `json:"tags,omitempty"`
}

// ServicePolicyPatch is the body of patchServicePolicy; nil fields are left
// unchanged. IdentityRoles, when set, replaces the whole role set.
type ServicePolicyPatch struct {
	Name          *string   `json:"name,omitempty"`
	IdentityRoles *[]string `json:"identityRoles,omitempty"`
	ServiceRoles  *[]string `json:"serviceRoles,omitempty"`
	Tags          Tags      `json:"tags,omitempty"`
}

// Identity is an identity resource (the fields of identityDetail that the
// projection reads).
type Identity struct {
	ID             string   `json:"id"`
	Name           string   `json:"name"`
	RoleAttributes []string `json:"roleAttributes,omitempty"`
	Tags           Tags     `json:"tags,omitempty"`
}

// ServiceConfig is one override of an identity (serviceConfigAssign): the
// identity sees ConfigID as the config of its type for ServiceID.
type ServiceConfig struct {
	ServiceID string `json:"serviceId"`
	ConfigID  string `json:"configId"`
}

// PolicyAdvice is the controller's answer on whether an identity may dial
// and bind a service (policyAdvice).
type PolicyAdvice struct {
	IdentityID    string `json:"identityId"`
	ServiceID     string `json:"serviceId"`
	IsBindAllowed bool   `json:"isBindAllowed"`
	IsDialAllowed bool   `json:"isDialAllowed"`
}

// Terminator precedences (terminatorPrecedence).
const (
	PrecedenceRequired = "required"
	PrecedenceDefault  = "default"
	PrecedenceFailed   = "failed"
)

// Terminator is a terminator resource (terminatorDetail). HostID is the Ziti
// identity id of the host that bound it.
type Terminator struct {
	ID         string `json:"id"`
	ServiceID  string `json:"serviceId"`
	RouterID   string `json:"routerId,omitempty"`
	Binding    string `json:"binding,omitempty"`
	Address    string `json:"address,omitempty"`
	Identity   string `json:"identity,omitempty"`
	HostID     string `json:"hostId,omitempty"`
	Precedence string `json:"precedence"`
	Cost       int    `json:"cost"`
}

// Errors returned by the client, wrapped in *APIError and matched with
// errors.Is.
var (
	// ErrNotFound means the controller answered 404 NOT_FOUND.
	ErrNotFound = errors.New("ziti: not found")
	// ErrInvalid means the controller answered 400 (the request does not
	// satisfy the API specification or the controller's rules).
	ErrInvalid = errors.New("ziti: invalid request")
	// ErrUnauthorized means the controller answered 401: the session is
	// missing or expired.
	ErrUnauthorized = errors.New("ziti: unauthorized")
	// ErrConflict means the controller answered 409: the object is referenced
	// by another.
	ErrConflict = errors.New("ziti: conflict")
	// ErrConfigInUse means the controller answered a config delete with
	// 500 "config is in use by identity".
	// It is an ordering fault (an override still names the config): never
	// retry it, remove the override first.
	ErrConfigInUse = errors.New("ziti: config is in use by identity")
	// ErrServer means the controller gave any other 5xx answer.
	ErrServer = errors.New("ziti: controller error")
	// ErrProtocol means the answer is not what the API specification promises
	// (bad JSON, a missing envelope, an unexpected status).
	ErrProtocol = errors.New("ziti: protocol error")
)

// APIError is an error answer of the controller (apiErrorEnvelope), with
// the HTTP status. errors.Is matches it against the sentinel of its class.
type APIError struct {
	Status       int    // HTTP status
	Code         string `json:"code"`
	Message      string `json:"message"`
	CauseMessage string `json:"causeMessage,omitempty"`
	RequestID    string `json:"requestId,omitempty"`
	Op           string // operationId of the failed call
}

func (e *APIError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "ziti: %s: %d %s: %s", e.Op, e.Status, e.Code, e.Message)
	if e.CauseMessage != "" {
		fmt.Fprintf(&b, " (%s)", e.CauseMessage)
	}
	return b.String()
}

// Unwrap returns the sentinel of the error's class.
func (e *APIError) Unwrap() error {
	switch {
	case e.Status == 404:
		return ErrNotFound
	case e.Status == 400:
		return ErrInvalid
	case e.Status == 401:
		return ErrUnauthorized
	case e.Status == 409:
		return ErrConflict
	case e.Status == 500 && strings.Contains(e.Message+" "+e.CauseMessage, "in use by identity"):
		return ErrConfigInUse
	case e.Status >= 500:
		return ErrServer
	}
	return ErrProtocol
}

// Quote returns s as a string literal of the controller's filter language
// (ZitiQL). Filter identifiers (field names, tag keys) are letters and
// underscores, dot-separated: a tag key with a dash cannot be filtered on.
func Quote(s string) string {
	r := strings.NewReplacer(`\`, `\\`, `"`, `\"`)
	return `"` + r.Replace(s) + `"`
}

// Eq returns the filter clause field = "value".
func Eq(field, value string) string { return field + " = " + Quote(value) }

// AnyOfEq returns the filter clause anyOf(field) = "value": some element of
// the list field equals value.
func AnyOfEq(field, value string) string { return "anyOf(" + field + ") = " + Quote(value) }

// And joins filter clauses with "and".
func And(clauses ...string) string { return strings.Join(clauses, " and ") }
