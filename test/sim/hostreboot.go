package sim

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"
)

// hostReboot is a reboot armed on a node's host by an os-upgrade Job, as the node
// program arms it: a transient systemd timer that outlives the pod (nodeprogram
// osupgrade.go scheduleReboot; Harvester's own upgrade-reboot.service,
// harvester-node-upgrade.md fact 28). Nothing in the cluster can take it back: the
// Job has completed, its Plan or Job can be deleted, the node uncordoned, and the host
// still reboots when the timer fires.
type hostReboot struct {
	node    string
	osImage string
	// at is when the host goes down; back when it is Ready again (zero until down).
	at, back time.Time
	record   int
	// lost says the timer is gone (LoseReboot): the host never goes down for it.
	lost bool
}

// rebootLostAfter is how long past its time the node program takes a scheduled reboot
// that did not come on the same boot as lost, and schedules it again (nodeprogram
// osupgrade.go rebootLostAfter, two minutes; scaled down here).
const rebootLostAfter = time.Second

// LoseReboot makes the next reboot armed on node's host never come: its timer is lost,
// as nodes were left unrebooted after their upgrade's node Job (harvester/harvester#6022,
// #7457). The node stays Ready on its boot and its OS. An os-upgrade Job on the node
// after the reboot's time (plus rebootLostAfter) schedules it again, as the node program
// does, and that one comes.
func (s *SUC) LoseReboot(node string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.lose == nil {
		s.lose = map[string]bool{}
	}
	s.lose[node] = true
}

// next is when the reboot's next change is due: going down, then coming back.
func (rb *hostReboot) next() time.Time {
	if rb.back.IsZero() {
		return rb.at
	}
	return rb.back
}

// armReboot arms the reboot of node's host, RebootDelay after now, into osImage. A
// reboot already armed there stays as it is (the node program finds its marker and
// arms nothing more), unless it was lost and its time is rebootLostAfter past: then it
// is armed anew.
func (s *SUC) armReboot(node, osImage string, now time.Time) {
	delay := s.RebootDelay
	if delay == 0 {
		delay = 300 * time.Millisecond
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.reboots == nil {
		s.reboots = map[string]*hostReboot{}
	}
	if rb, armed := s.reboots[node]; armed && (!rb.lost || !now.After(rb.at.Add(rebootLostAfter))) {
		return
	}
	s.reboots[node] = &hostReboot{node: node, osImage: osImage, at: now.Add(delay), lost: s.lose[node]}
	delete(s.lose, node)
}

// RebootArmed tells whether a reboot is armed on node's host and has not finished.
func (s *SUC) RebootArmed(node string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, armed := s.reboots[node]
	return armed
}

// playReboots plays the armed reboots that are due: the host goes down (NotReady; the
// restart guard under /run goes with the tmpfs, fact 12), and RebootDuration later its
// kubelet reports Ready on a new boot, on the OS the Job installed.
func (s *SUC) playReboots(ctx context.Context) error {
	now := s.clock().Now()
	duration := s.RebootDuration
	if duration == 0 {
		duration = 200 * time.Millisecond
	}
	s.mu.Lock()
	var due []*hostReboot
	for _, rb := range s.reboots {
		if !rb.lost && !now.Before(rb.next()) {
			due = append(due, rb)
		}
	}
	s.mu.Unlock()
	sort.Slice(due, func(i, j int) bool { return due[i].node < due[j].node })
	var errs []error
	for _, rb := range due {
		if rb.back.IsZero() {
			if err := s.Kubelet.SetReady(ctx, rb.node, false, "Rebooting"); err != nil {
				errs = append(errs, fmt.Errorf("reboot node %s: %w", rb.node, err))
				continue
			}
			s.mu.Lock()
			rb.record = s.Record.rebootStarted(rb.node, now)
			rb.back = now.Add(duration)
			delete(s.guarded, rb.node)
			s.mu.Unlock()
			continue
		}
		if err := s.Kubelet.Rebooted(ctx, rb.node, rb.osImage); err != nil {
			errs = append(errs, fmt.Errorf("node %s back from its reboot: %w", rb.node, err))
			continue
		}
		s.Record.rebootEnded(rb.record, now)
		s.mu.Lock()
		delete(s.reboots, rb.node)
		s.mu.Unlock()
	}
	return errors.Join(errs...)
}
