// Package harvesterapi holds the few Harvester kinds of harvesterhci.io/v1beta1 that the
// Harvester updater reads and that no Go module reachable through the module proxy
// provides (github.com/harvester/harvester is not served by it): VirtualMachineBackup and
// ScheduleVMBackup, whose state the cluster preflight check VMBackupsIdle reads
// (shared/facts/harvester-node-upgrade.md, facts 4a and 47), and Addon, whose descheduler
// the UpgradePlan turns off for the node phase and which the cluster upgrade brings to the
// release (addon.go, with its status subresource). They hold only the fields the
// updater reads or a test needs to create a valid object, with the JSON names, kinds,
// short names, scope and printer columns of Harvester's own types in
// harvester/harvester pkg/apis/harvesterhci.io/v1beta1/backup.go (commit 2f0faa1) and
// schedulebackup.go (commit e9a986a). Like Harvester's CRDs (registered with wrangler's
// crd.FromGV, without a status subresource), neither has a status subresource. The
// updater never creates either kind.
//
// Setting (settings.harvesterhci.io, cluster-scoped) is Harvester's setting, whose
// overcommit-config the cluster upgrade keeps at its old default for a hop from v1.7.x
// (harvester-release-steps.md fact 10): the JSON names of harvester/harvester
// pkg/apis/harvesterhci.io/v1beta1/settings.go at v1.7.1 (commit 59a0a3e), registered
// there as a cluster-scoped kind without a status subresource (pkg/data/crd.go,
// crd.NonNamespacedFromGV).
//
// +kubebuilder:object:generate=true
// +groupName=harvesterhci.io
// +versionName=v1beta1
package harvesterapi

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// GroupVersion is Harvester's API group and version.
var GroupVersion = schema.GroupVersion{Group: "harvesterhci.io", Version: "v1beta1"}

// AddToScheme registers the kinds of this package under harvesterhci.io/v1beta1.
func AddToScheme(s *runtime.Scheme) error {
	s.AddKnownTypes(GroupVersion, &VirtualMachineBackup{}, &VirtualMachineBackupList{},
		&ScheduleVMBackup{}, &ScheduleVMBackupList{}, &Addon{}, &AddonList{}, &Setting{}, &SettingList{}, &Upgrade{}, &UpgradeList{})
	metav1.AddToGroupVersion(s, GroupVersion)
	return nil
}

// BackupType is what a VirtualMachineBackup makes: a backup to the backup target or a
// snapshot in the cluster.
type BackupType string

// The types of a VirtualMachineBackup.
const (
	BackupTypeBackup   BackupType = "backup"
	BackupTypeSnapshot BackupType = "snapshot"
)

// VirtualMachineBackupSpec is the virtual machine a backup is taken of, and how.
type VirtualMachineBackupSpec struct {
	// source is the virtual machine backed up.
	Source corev1.TypedLocalObjectReference `json:"source"`
	// type is backup or snapshot.
	// +kubebuilder:default:="backup"
	// +kubebuilder:validation:Enum=backup;snapshot
	// +kubebuilder:validation:Optional
	Type BackupType `json:"type,omitempty"`
}

// Error is the last error a backup met.
type Error struct {
	// time is when the error happened.
	// +optional
	Time *metav1.Time `json:"time,omitempty"`
	// message says what went wrong.
	// +optional
	Message *string `json:"message,omitempty"`
}

// VirtualMachineBackupStatus is how a backup stands. Harvester's has more fields (the
// source spec, volume and secret backups, conditions); they are left out.
type VirtualMachineBackupStatus struct {
	// progress is the percentage of the backup done.
	// +optional
	Progress int `json:"progress,omitempty"`
	// readyToUse says the backup is complete.
	// +optional
	ReadyToUse *bool `json:"readyToUse,omitempty"`
	// error is the error the backup failed with.
	// +optional
	Error *Error `json:"error,omitempty"`
}

// Running says whether the backup is still being taken: it is neither complete nor
// failed. A backup without a status has just been created and is about to run.
func (b *VirtualMachineBackup) Running() bool {
	st := b.Status
	if st == nil {
		return true
	}
	return (st.ReadyToUse == nil || !*st.ReadyToUse) && st.Error == nil
}

// VirtualMachineBackup is a backup or snapshot of a Harvester virtual machine.
// +kubebuilder:object:root=true
// +kubebuilder:resource:shortName=vmbackup;vmbackups,scope=Namespaced
// +kubebuilder:printcolumn:name="SOURCE_KIND",type=string,JSONPath=`.spec.source.kind`
// +kubebuilder:printcolumn:name="SOURCE_NAME",type=string,JSONPath=`.spec.source.name`
// +kubebuilder:printcolumn:name="TYPE",type=string,JSONPath=`.spec.type`
// +kubebuilder:printcolumn:name="READY_TO_USE",type=boolean,JSONPath=`.status.readyToUse`
// +kubebuilder:printcolumn:name="AGE",type=date,JSONPath=`.metadata.creationTimestamp`
type VirtualMachineBackup struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec VirtualMachineBackupSpec `json:"spec"`
	// +optional
	Status *VirtualMachineBackupStatus `json:"status,omitempty"`
}

// VirtualMachineBackupList is a list of VirtualMachineBackups.
// +kubebuilder:object:root=true
type VirtualMachineBackupList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []VirtualMachineBackup `json:"items"`
}

// ScheduleVMBackupSpec is when a virtual machine is backed up, and how many backups are
// kept.
type ScheduleVMBackupSpec struct {
	// cron is the schedule.
	// +kubebuilder:validation:Required
	Cron string `json:"cron"`
	// retain is how many backups are kept.
	// +kubebuilder:validation:Required
	// +kubebuilder:default:=8
	// +kubebuilder:validation:Maximum=250
	// +kubebuilder:validation:Minimum=2
	Retain int `json:"retain"`
	// maxFailure is how many failed backups suspend the schedule.
	// +kubebuilder:validation:Required
	// +kubebuilder:default:=4
	// +kubebuilder:validation:Minimum=2
	MaxFailure int `json:"maxFailure"`
	// suspend asks Harvester to suspend the schedule.
	// +optional
	// +kubebuilder:default:=false
	Suspend bool `json:"suspend"`
	// vmbackup is the backup the schedule takes.
	// +kubebuilder:validation:Required
	VMBackupSpec VirtualMachineBackupSpec `json:"vmbackup"`
}

// ScheduleVMBackupStatus is how a schedule stands. Harvester's has more fields (the
// backups taken, conditions); they are left out.
type ScheduleVMBackupStatus struct {
	// failure is how many backups in a row failed.
	// +optional
	Failure int `json:"failure,omitempty"`
	// suspended says Harvester has suspended the schedule.
	// +optional
	Suspended bool `json:"suspended,omitempty"`
}

// ScheduleVMBackup takes backups or snapshots of a virtual machine on a schedule.
// +kubebuilder:object:root=true
// +kubebuilder:resource:shortName=svmbackup;svmbackups,scope=Namespaced
// +kubebuilder:printcolumn:name="Cron",type=string,JSONPath=`.spec.cron`
// +kubebuilder:printcolumn:name="Retain",type=integer,JSONPath=`.spec.retain`
// +kubebuilder:printcolumn:name="MaxFailure",type=integer,JSONPath=`.spec.maxFailure`
// +kubebuilder:printcolumn:name="SpecSuspend",type=boolean,JSONPath=`.spec.suspend`
// +kubebuilder:printcolumn:name="Source",type=string,JSONPath=`.spec.vmbackup.source.name`
// +kubebuilder:printcolumn:name="Suspended",type=string,JSONPath=`.status.suspended`
// +kubebuilder:printcolumn:name="Failure",type=integer,JSONPath=`.status.failure`
type ScheduleVMBackup struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec ScheduleVMBackupSpec `json:"spec"`
	// +optional
	Status ScheduleVMBackupStatus `json:"status,omitempty"`
}

// ScheduleVMBackupList is a list of ScheduleVMBackups.
// +kubebuilder:object:root=true
type ScheduleVMBackupList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []ScheduleVMBackup `json:"items"`
}

// SettingCondition is one condition of a Setting or an Addon (Harvester's Condition,
// pkg/apis/harvesterhci.io/v1beta1 image.go).
type SettingCondition struct {
	// type of the condition, such as configured.
	Type string `json:"type"`
	// status is True, False or Unknown.
	Status corev1.ConditionStatus `json:"status"`
	// lastUpdateTime is when it was last updated.
	// +optional
	LastUpdateTime string `json:"lastUpdateTime,omitempty"`
	// lastTransitionTime is when it last changed status.
	// +optional
	LastTransitionTime string `json:"lastTransitionTime,omitempty"`
	// reason is a one-word reason.
	// +optional
	Reason string `json:"reason,omitempty"`
	// message says more.
	// +optional
	Message string `json:"message,omitempty"`
}

// SettingStatus is what Harvester's setting controller reports of a Setting.
type SettingStatus struct {
	// conditions of the setting.
	// +optional
	Conditions []SettingCondition `json:"conditions,omitempty"`
}

// Setting is one of Harvester's settings: its default (written by Harvester at start, the
// running release's) and, when someone set it, its value, which wins.
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Cluster
// +kubebuilder:printcolumn:name="VALUE",type="string",JSONPath=`.value`
type Setting struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// value is the setting's explicit value; empty means the default applies.
	// +optional
	Value string `json:"value,omitempty"`
	// default is the running release's default.
	// +optional
	Default string `json:"default,omitempty"`
	// customized says whether the value was set by a user.
	// +optional
	Customized bool `json:"customized,omitempty"`
	// source is where the value came from.
	// +optional
	Source string `json:"source,omitempty"`
	// status is what Harvester's setting controller reports.
	// +optional
	Status SettingStatus `json:"status,omitempty"`
}

// SettingList is a list of Settings.
//
// +kubebuilder:object:root=true
type SettingList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Setting `json:"items"`
}
