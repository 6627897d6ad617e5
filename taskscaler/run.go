package taskscaler

// The loop and the shutdown.

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/berthci/berth/taskscaler/ledger"
)

// Run ticks every TickInterval (sooner when a release or a waiting Acquire
// asks for it) until ctx ends or Shutdown is called. It returns nil after
// Shutdown, ctx's error otherwise. Call it once.
func (s *Scaler) Run(ctx context.Context) error {
	s.runMu.Lock()
	if s.runShut {
		s.runMu.Unlock()
		return nil
	}
	if s.running {
		s.runMu.Unlock()
		return errors.New("taskscaler: Run called twice")
	}
	s.running = true
	s.runDone = make(chan struct{})
	s.runMu.Unlock()
	defer close(s.runDone)
	for {
		s.Tick(ctx)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-s.stop:
			return nil
		case <-s.kick:
		case <-s.clock.After(s.opts.TickInterval):
		}
	}
}

// Shutdown stops the scaler: it stops scaling and refuses new
// reservations, waits (bounded by ctx) for acquired slots to be released,
// deletes every instance if delete_instances_on_shutdown — before the
// plugin is stopped — and finally calls the group's Shutdown. Deletion runs
// up to shutdown_deletion_retries rounds of Decrease, a pause of
// shutdown_deletion_interval and an Update, even when ctx has ended (its
// deadline bounds the wait for jobs, not the clean-up). Without deletion,
// the instances stay for the next start to adopt (with state storage).
func (s *Scaler) Shutdown(ctx context.Context) error {
	s.shutdownM.Lock()
	defer s.shutdownM.Unlock()
	if s.shutdown {
		return nil
	}
	s.shutdown = true
	s.mu.Lock()
	s.stopping = true
	clear(s.reservations)
	s.waiting = 0
	s.broadcast()
	s.mu.Unlock()
	s.stopOnce.Do(func() { close(s.stop) })
	s.runMu.Lock()
	running, done := s.running, s.runDone
	s.runShut = true
	s.runMu.Unlock()
	if running {
		<-done
	}
	s.waitReleased(ctx)
	s.bgCancel()
	s.bg.Wait()

	var errs []error
	clean := context.WithoutCancel(ctx)
	if s.cfg.DeleteInstancesOnShutdown {
		if err := s.deleteAll(clean); err != nil {
			errs = append(errs, err)
		}
	}
	sctx, cancel := context.WithTimeout(clean, 30*time.Second)
	if err := s.group.Shutdown(sctx); err != nil {
		errs = append(errs, fmt.Errorf("shutting down the instance group: %w", err))
	}
	cancel()
	s.saveModel(s.clock.Now(), true)
	s.mu.Lock()
	s.closeState()
	s.mu.Unlock()
	return errors.Join(errs...)
}

func (s *Scaler) waitReleased(ctx context.Context) {
	for {
		s.mu.Lock()
		n, ch := len(s.acquisitions), s.changed
		s.mu.Unlock()
		if n == 0 {
			return
		}
		select {
		case <-ctx.Done():
			s.log.Warn("shutdown: jobs still hold slots", "slots", n)
			return
		case <-ch:
		}
	}
}

func (s *Scaler) deleteAll(ctx context.Context) error {
	if s.lease != nil && !s.owner {
		return fmt.Errorf("delete_instances_on_shutdown: %w", ErrNotOwner)
	}
	for round := 1; ; round++ {
		s.mu.Lock()
		var ids []string
		for _, in := range s.order {
			if in.phase != PhaseDeleting {
				if in.phase != PhaseRemoving {
					s.account(in, -1)
					in.phase, in.removeReason = PhaseRemoving, "shutdown"
					s.account(in, 1)
					s.record(ledger.Event{Op: ledger.OpRemoving, ID: in.id})
				}
				ids = append(ids, in.id)
			}
		}
		// Instances asked for but not listed yet count too: the plugin
		// may be making them; they are deleted once an Update lists them
		// (or forgotten after instance_creating_timeout). Leaving them
		// out left an instance made just before a shutdown running.
		left := len(s.order) + len(s.requested)
		s.mu.Unlock()
		if left == 0 {
			s.log.Info("shutdown: all instances deleted")
			return nil
		}
		if round > s.cfg.ShutdownDeletionRetries {
			return fmt.Errorf("delete_instances_on_shutdown: %d instances still listed after %d rounds", left, s.cfg.ShutdownDeletionRetries)
		}
		if len(ids) > 0 {
			cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			ok, err := s.group.Decrease(cctx, ids)
			cancel()
			s.log.Info("shutdown: deleting instances", "round", round, "asked", len(ids), "accepted", len(ok), "err", err)
		}
		<-s.clock.After(s.cfg.ShutdownDeletionInterval)
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		s.observe(cctx)
		cancel()
	}
}
