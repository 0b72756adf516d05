//! The epoch lock, as guard types: every mutation of SRC holds it shared (from its Layer 1
//! backup to the end of its syscall), and a checkpoint or gc holds it alone. So no
//! checkpoint falls between a mutation's backup and the mutation itself (which would record
//! the pre-change state while the change landed unbacked in the next epoch), and gc never
//! sweeps an object a backup is about to name.
//!
//! The operations that need every mutation excluded are methods of [`Quiesced`], the guard
//! [`History::quiesce`] returns: that precondition is a type, not a doc comment (as jj's
//! `LockedWorkingCopy`).
use std::io;
use std::sync::{RwLockReadGuard, RwLockWriteGuard};

use super::History;
use super::gc::{GcPlanned, GcReport, Retention};
use super::open_files::PreCopies;

/// Held by a mutation (the gate's permits) while its backup and syscall run.
pub struct MutationAdmitted<'h> {
    _shared: RwLockReadGuard<'h, ()>,
}

/// No mutation runs while this lives. Made by [`History::quiesce`].
pub struct Quiesced<'h> {
    _exclusive: RwLockWriteGuard<'h, ()>,
    history: &'h History,
}

impl History {
    /// Waits until no checkpoint or gc runs, then admits one mutation until the guard drops.
    pub fn admit_mutation(&self) -> MutationAdmitted<'_> {
        MutationAdmitted {
            _shared: self.epoch.read().unwrap_or_else(|p| p.into_inner()),
        }
    }

    /// Waits until every admitted mutation is done and keeps new ones out until the guard
    /// drops. Lock order: the control maintenance lock, then this, then `state`.
    pub fn quiesce(&self) -> Quiesced<'_> {
        Quiesced {
            _exclusive: self.epoch.write().unwrap_or_else(|p| p.into_inner()),
            history: self,
        }
    }
}

impl History {
    /// gc in the daemon (the caller holds the control maintenance lock): planned with
    /// mutations running, then done with them excluded (see [`Quiesced::gc`]).
    pub fn gc(
        &self,
        retention: Retention,
        dry_run: bool,
        progress: &mut dyn FnMut(usize, usize),
    ) -> io::Result<GcReport> {
        let planned = self.gc_plan(retention)?;
        self.quiesce().gc(planned, dry_run, progress)
    }
}

impl Quiesced<'_> {
    /// Layer 2: takes checkpoint `id` for agent session `session` (`None`: outside any).
    /// `open_for_write`: the paths of files open for writing now; `pre_copies`: their copies
    /// made before quiescing (see `open_files`).
    pub fn make_checkpoint(
        &self,
        id: &str,
        session: Option<String>,
        open_for_write: &[Vec<u8>],
        pre_copies: PreCopies,
    ) -> io::Result<()> {
        self.history
            .record_checkpoint(id, session, open_for_write, pre_copies)?;
        self.history.notify_checkpoint_listeners();
        Ok(())
    }

    /// gc in the daemon, keeping memory and the on-disk transcript in step, from `planned`
    /// ([`History::gc`]); the caller also holds the control maintenance lock.
    /// `progress(done, total)` follows the sweep.
    /// Mutations are admitted again (this guard is consumed) before the doomed objects are
    /// removed and the packs that held some are rewritten: that is most of gc's IO, and
    /// needs no quiesce (see `store::doomed`).
    pub(super) fn gc(
        self,
        planned: GcPlanned,
        dry_run: bool,
        progress: &mut dyn FnMut(usize, usize),
    ) -> io::Result<GcReport> {
        let Quiesced {
            _exclusive,
            history,
        } = self;
        let (mut report, after) = history.gc_quiesced(planned, dry_run)?;
        drop(_exclusive);
        if let Some(after) = after {
            after.finish(&mut report, progress)?;
        }
        Ok(report)
    }
}
