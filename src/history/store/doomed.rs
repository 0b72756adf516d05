//! Objects gc has decided to remove, from the moment it decides (with mutations excluded)
//! until each is gone (with mutations running again), so that gc's pause does not grow with
//! the number of objects it drops (issue 28).
//!
//! The race this closes: a put whose content is already stored does not write it again (the
//! object is *reused*), so a put that finds a doomed object about to be removed would hand
//! back a name with nothing behind it. Every put therefore *claims* its content's name
//! before it looks for an existing object ([`Doomed::claim`]):
//! - a name still only doomed becomes claimed, and gc leaves that object alone;
//! - a name being removed at this moment makes the put wait until it is gone (one index
//!   update and one `unlinkat`, no more), after which the put finds nothing and stores the
//!   content again;
//! - any other name is not gc's business.
//!
//! Invariant: names are doomed ([`Doomed::mark`]) only while no put can run that started
//! before (gc holds the history's quiesce and has paused the fills), so a put either ended
//! before the mark or claims after it. `any` lets puts skip the lock while nothing is
//! doomed, which is nearly always.
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Doom {
    /// gc will remove it unless a put claims it first.
    Doomed,
    /// A put reused it after gc doomed it: gc must keep it.
    Claimed,
    /// gc is removing it now; a put waits until it is gone.
    Removing,
}

#[derive(Default, Debug)]
pub(super) struct Doomed {
    names: Mutex<HashMap<String, Doom>>,
    /// Notified whenever a removal ends (or the set is cleared).
    removed: Condvar,
    /// Whether `names` may be non-empty (puts skip the lock when it is not).
    any: AtomicBool,
}

impl Doomed {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, Doom>> {
        self.names.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// gc, with mutations excluded: these objects are to be removed.
    pub(super) fn mark(&self, names: impl IntoIterator<Item = String>) {
        let mut map = self.lock();
        map.extend(names.into_iter().map(|n| (n, Doom::Doomed)));
        self.any.store(!map.is_empty(), Ordering::Release);
    }

    /// A put of content named `name`, before it looks for an existing object: afterwards
    /// an object it finds stays, and one it does not find is not being removed.
    pub(super) fn claim(&self, name: &str) {
        if !self.any.load(Ordering::Acquire) {
            return;
        }
        let mut map = self.lock();
        loop {
            match map.get_mut(name) {
                Some(doom @ Doom::Doomed) => {
                    *doom = Doom::Claimed;
                    return;
                }
                // Bounded: the removal of one object is in flight (see the module doc).
                Some(Doom::Removing) => {
                    map = self.removed.wait(map).unwrap_or_else(|p| p.into_inner());
                }
                Some(Doom::Claimed) | None => return,
            }
        }
    }

    /// gc: whether it may remove `name` now; if so, the name is [`Doom::Removing`] until
    /// [`Doomed::end_removal`]. A claimed name is forgotten (kept) and gives false.
    pub(super) fn begin_removal(&self, name: &str) -> bool {
        let mut map = self.lock();
        match map.get_mut(name) {
            Some(doom @ Doom::Doomed) => {
                *doom = Doom::Removing;
                true
            }
            Some(Doom::Claimed) => {
                map.remove(name);
                self.any.store(!map.is_empty(), Ordering::Release);
                false
            }
            Some(Doom::Removing) | None => false,
        }
    }

    /// gc: `name`'s removal ended (done or failed); a put waiting for it goes on.
    pub(super) fn end_removal(&self, name: &str) {
        let mut map = self.lock();
        map.remove(name);
        self.any.store(!map.is_empty(), Ordering::Release);
        drop(map);
        self.removed.notify_all();
    }

    /// Forgets every name left (gc stopped early): those objects stay.
    pub(super) fn clear(&self) {
        let mut map = self.lock();
        map.clear();
        self.any.store(false, Ordering::Release);
        drop(map);
        self.removed.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_claimed_name_is_kept_and_others_removed() {
        let d = Doomed::default();
        d.mark(["a".to_string(), "b".to_string()]);
        d.claim("a");
        d.claim("c");
        assert!(!d.begin_removal("a"), "claimed: kept");
        assert!(d.begin_removal("b"));
        d.end_removal("b");
        assert!(!d.any.load(Ordering::Acquire));
        assert!(!d.begin_removal("c"), "never doomed");
    }

    #[test]
    fn a_put_during_a_removal_waits_until_the_object_is_gone() {
        let d = std::sync::Arc::new(Doomed::default());
        d.mark(["x".to_string()]);
        assert!(d.begin_removal("x"));
        let ended = std::sync::Arc::new(AtomicBool::new(false));
        let (tx, rx) = std::sync::mpsc::channel();
        let putter = {
            let (d, ended) = (std::sync::Arc::clone(&d), std::sync::Arc::clone(&ended));
            std::thread::spawn(move || {
                d.claim("x");
                // Whenever the claim returns, the removal has ended.
                assert!(ended.load(Ordering::SeqCst));
                tx.send(()).unwrap();
            })
        };
        // Not synchronisation: a window in which a claim that did not wait would return.
        assert!(
            rx.recv_timeout(std::time::Duration::from_millis(200))
                .is_err()
        );
        ended.store(true, Ordering::SeqCst);
        d.end_removal("x");
        rx.recv().unwrap();
        putter.join().unwrap();
    }

    #[test]
    fn clearing_releases_waiters_and_keeps_everything() {
        let d = Doomed::default();
        d.mark(["y".to_string()]);
        d.clear();
        assert!(!d.begin_removal("y"));
        d.claim("y");
    }
}
