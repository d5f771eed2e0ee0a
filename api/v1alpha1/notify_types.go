package v1alpha1

// NotifySecretAnnotation on a Cluster names a Secret, in the Cluster's namespace, that
// configures the notification webhook of every UpgradeTask of the Cluster without
// spec.notify: tasks made by Cluster API's hooks and by the annotation cascade have no
// spec written by a person.
const NotifySecretAnnotation = AnnotationPrefix + "notify-secret"

// Keys of a notification Secret.
const (
	// NotifyURLKey holds the webhook's URL: https, or http when the manager runs with
	// --allow-http-fetch. Required.
	NotifyURLKey = "url"
	// NotifyTokenKey holds a bearer token sent as "Authorization: Bearer <token>". Optional.
	NotifyTokenKey = "token"
	// NotifyHeadersKey holds extra HTTP headers, one "Name: value" a line. Optional.
	NotifyHeadersKey = "headers"
	// NotifyCAKey holds the PEM certificates that sign the webhook's TLS certificate,
	// used instead of the system's. Optional.
	NotifyCAKey = "ca.crt"
	// NotifyFormatKey holds the body's format, JSON or Slack, when spec.notify.format
	// does not say it (always the case for a Cluster's annotation). Optional; JSON by default.
	NotifyFormatKey = "format"
)

// Event reasons of notifications that could not be sent.
const (
	// NotificationNotConfiguredReason: the notification Secret is missing or lacks a key;
	// the event names what to create. The upgrade goes on.
	NotificationNotConfiguredReason = "NotificationNotConfigured"
	// NotificationFailedReason: the webhook did not accept a notification after every attempt.
	NotificationFailedReason = "NotificationFailed"
)

// NotifyFormat is the body a notification webhook receives.
// +kubebuilder:validation:Enum=JSON;Slack
type NotifyFormat string

const (
	// NotifyFormatJSON: a JSON object with the event's fields (docs/upgradetask.md).
	NotifyFormatJSON NotifyFormat = "JSON"
	// NotifyFormatSlack: {"text": "..."}, what a Slack incoming webhook (and the many
	// receivers compatible with it) takes.
	NotifyFormatSlack NotifyFormat = "Slack"
)

// NotifySpec configures the webhook told when the task starts, a node fails, the task
// pauses or resumes, and the task ends.
type NotifySpec struct {
	// secretRef names a Secret in the task's namespace with the webhook's "url"
	// (required), and optionally "token" (sent as a bearer token), "headers" (one
	// "Name: value" a line), "ca.crt" (PEM) and "format". The url must be https (http
	// only when the manager runs with --allow-http-fetch); link-local, cloud metadata and
	// loopback addresses and redirects to another host are refused. A missing Secret or key is a
	// Warning event on the task; the upgrade goes on.
	// +required
	SecretRef LocalSecretReference `json:"secretRef"`

	// format is the body sent: JSON (the event's fields) or Slack ({"text": ...}).
	// Unset means the Secret's "format" key, else JSON.
	// +optional
	Format NotifyFormat `json:"format,omitempty"`
}

// LocalSecretReference names a Secret in the namespace of the object that refers to it.
type LocalSecretReference struct {
	// name is the Secret's name.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`
}
