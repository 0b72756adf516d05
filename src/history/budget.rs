//! What users other than the mount's owner may cost the owner's state dir (issue 28 item 7).
//!
//! On an `--allow-other` or `--owner` mount, other users' changes and checkpoint ids are
//! recorded in the *owner's* state dir. Without a bound, another user could fill it: every
//! `ctl` id costs a record, every first change a backup and a record. So each uid that is
//! neither the owner nor root (who can fill any disk anyway) has an [`OthersBudget`]: a number
//! of `ctl` lines (checkpoint ids and session registrations) and a number of state bytes
//! (new store content and record bytes its changes caused). Past it, that user's changes and
//! `ctl` writes fail with EDQUOT *before* anything is changed or recorded; the owner's never
//! do for it.
//!
//! Budgets count from the mount (the daemon's lifetime): only the owner can remount, and the
//! bound is on what one mount lets others cost.
//!
//! How bytes are charged: Layer 1 runs on the thread of the request that causes it, so the
//! entry points of Layer 1 ([`Budgets::pay_as`]) name the payer of the current thread, and
//! the store ([`check_room`], [`charge`]) and the record writers ([`charge`]) charge whoever
//! pays on their thread. A background copy (a version filled after a checkpoint) has no
//! payer: its cost was the owner's choice to keep a file open across a checkpoint.
use std::cell::RefCell;
use std::collections::HashMap;
use std::fmt;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use serde::{Deserialize, Serialize};

use crate::sys::errno;

/// The budget of each uid other than the owner and root. Settable with `mount
/// --other-users-budget CHECKPOINTS,SIZE`, and saved in the state dir's settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct OthersBudget {
    /// `ctl` lines (checkpoint ids, session registrations).
    pub ctl_lines: u64,
    /// State bytes: new store content plus record bytes.
    pub bytes: u64,
}

impl Default for OthersBudget {
    /// 1,000 `ctl` lines (a few hundred KB of records) and 8 MiB: enough for another user to
    /// take checkpoints and make small edits, and a small fraction of any disk a state dir
    /// lives on. An owner who shares a mount for real work raises it.
    fn default() -> Self {
        OthersBudget {
            ctl_lines: 1_000,
            bytes: 8 << 20,
        }
    }
}

impl fmt::Display for OthersBudget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{},{}", self.ctl_lines, self.bytes)
    }
}

impl FromStr for OthersBudget {
    type Err = String;

    /// `CHECKPOINTS,SIZE`, SIZE in bytes or with a K, M, G suffix (powers of 1024; `KiB`,
    /// `MiB`, `GiB` also accepted): `1000,8M`.
    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || {
            format!(
                "{s:?} is not CHECKPOINTS,SIZE (for example 1000,8M: 1,000 ctl lines and 8 MiB \
                 per other user)"
            )
        };
        let (lines, size) = s.split_once(',').ok_or_else(bad)?;
        let ctl_lines = lines.trim().parse::<u64>().map_err(|_| bad())?;
        let size = size.trim();
        let digits = size.trim_end_matches(|c: char| c.is_ascii_alphabetic());
        let shift = match &size[digits.len()..] {
            "" | "B" => 0,
            "K" | "KiB" => 10,
            "M" | "MiB" => 20,
            "G" | "GiB" => 30,
            _ => return Err(bad()),
        };
        let bytes = digits
            .parse::<u64>()
            .ok()
            .and_then(|n| n.checked_mul(1 << shift))
            .ok_or_else(bad)?;
        Ok(OthersBudget { ctl_lines, bytes })
    }
}

/// `status`'s `other_users`: each other user's budget, and what those who used the mount
/// have cost since it was made.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OtherUsers {
    pub budget: OthersBudget,
    pub usage: Vec<OtherUserUsage>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OtherUserUsage {
    pub uid: u32,
    pub ctl_lines: u64,
    pub state_bytes: u64,
}

/// What one uid has cost since the mount.
#[derive(Debug, Default)]
struct Account {
    uid: u32,
    ctl_lines: AtomicU64,
    bytes: AtomicU64,
}

/// The budgets of one mount. Unconfigured (offline use, tests of the history alone), nobody
/// is limited.
#[derive(Debug, Default)]
pub struct Budgets {
    config: OnceLock<Config>,
    accounts: Mutex<HashMap<u32, Arc<Account>>>,
}

#[derive(Debug)]
struct Config {
    limits: OthersBudget,
    /// The owner's uid; root is always exempt too.
    owner: u32,
}

thread_local! {
    /// Who pays for what Layer 1 stores and records on this thread (see the module docs).
    static PAYER: RefCell<Option<(Arc<Account>, OthersBudget)>> = const { RefCell::new(None) };
}

/// Names the payer of the current thread until dropped (then the previous one again).
#[must_use]
pub struct PayerGuard {
    previous: Option<(Arc<Account>, OthersBudget)>,
}

impl Drop for PayerGuard {
    fn drop(&mut self) {
        let previous = self.previous.take();
        PAYER.with(|p| *p.borrow_mut() = previous);
    }
}

fn over_budget(what: &'static str, account: &Account, limit: u64) -> std::io::Error {
    warn_once(account.uid, what, || {
        format!(
            "uid {} reached its budget of {limit} {what} on this mount (mount \
             --other-users-budget); its changes and ctl writes now fail with EDQUOT",
            account.uid
        )
    });
    errno(libc::EDQUOT)
}

/// One warning per uid and kind: a refused user retries, and the log must not grow with
/// their retries.
fn warn_once(uid: u32, what: &'static str, message: impl FnOnce() -> String) {
    static WARNED: Mutex<Vec<(u32, &'static str)>> = Mutex::new(Vec::new());
    let mut warned = WARNED.lock().unwrap_or_else(|p| p.into_inner());
    if !warned.contains(&(uid, what)) {
        warned.push((uid, what));
        log::warn!("{}", message());
    }
}

impl Budgets {
    /// Limits every uid but `owner` and root to `limits`, from now on. Once only.
    pub fn configure(&self, owner: u32, limits: OthersBudget) {
        let _ = self.config.set(Config { limits, owner });
    }

    /// Whether `uid` is limited here: a daemon's budgets are configured, and `uid` is
    /// neither root nor the owner.
    pub fn is_limited(&self, uid: u32) -> bool {
        self.config
            .get()
            .is_some_and(|config| uid != 0 && uid != config.owner)
    }

    /// A change by `uid` to a branch's upper layer, which is the owner's state dir: refused
    /// with EACCES (logged once per uid) for a limited uid, since the budgets do not cover
    /// branches yet and nothing of theirs may grow it without bound.
    pub fn check_branch_change(&self, uid: u32) -> std::io::Result<()> {
        if !self.is_limited(uid) {
            return Ok(());
        }
        warn_once(uid, "branch changes", || {
            format!(
                "uid {uid} may not change a branch on this mount (EACCES): a branch's \
                 storage is the owner's state dir, and other users' budgets do not cover it \
                 yet"
            )
        });
        Err(errno(libc::EACCES))
    }

    /// The account of `uid` if it is limited, with its limits.
    fn account(&self, uid: u32) -> Option<(Arc<Account>, OthersBudget)> {
        let config = self.config.get()?;
        if uid == 0 || uid == config.owner {
            return None;
        }
        let mut accounts = self.accounts.lock().unwrap_or_else(|p| p.into_inner());
        let account = accounts
            .entry(uid)
            .or_insert_with(|| {
                Arc::new(Account {
                    uid,
                    ..Default::default()
                })
            })
            .clone();
        Some((account, config.limits))
    }

    /// Layer 1 for a change by `uid` starts: refused with EDQUOT if `uid` has spent its state
    /// bytes; else `uid` pays for what this thread stores and records until the guard drops.
    pub fn pay_as(&self, uid: u32) -> std::io::Result<PayerGuard> {
        let payer = self.account(uid);
        if let Some((account, limits)) = &payer
            && account.bytes.load(Ordering::Relaxed) >= limits.bytes
        {
            return Err(over_budget("state bytes", account, limits.bytes));
        }
        let previous = PAYER.with(|p| std::mem::replace(&mut *p.borrow_mut(), payer));
        Ok(PayerGuard { previous })
    }

    /// `uid` writes `lines` lines to `ctl`: refused with EDQUOT, taking none of them, if that
    /// would pass its budget of lines or it has spent its state bytes.
    pub fn charge_ctl_lines(&self, uid: u32, lines: u64) -> std::io::Result<()> {
        let Some((account, limits)) = self.account(uid) else {
            return Ok(());
        };
        if account.bytes.load(Ordering::Relaxed) >= limits.bytes {
            return Err(over_budget("state bytes", &account, limits.bytes));
        }
        account
            .ctl_lines
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |used| {
                used.checked_add(lines).filter(|&n| n <= limits.ctl_lines)
            })
            .map(drop)
            .map_err(|_| over_budget("ctl lines", &account, limits.ctl_lines))
    }

    /// The budget and what each limited uid has cost so far, for `status`; `None` when
    /// unconfigured (no daemon).
    pub fn status(&self) -> Option<OtherUsers> {
        let config = self.config.get()?;
        Some(OtherUsers {
            budget: config.limits,
            usage: self
                .usage()
                .into_iter()
                .map(|(uid, ctl_lines, state_bytes)| OtherUserUsage {
                    uid,
                    ctl_lines,
                    state_bytes,
                })
                .collect(),
        })
    }

    /// What each limited uid has cost so far: (uid, ctl lines, state bytes), by uid.
    pub fn usage(&self) -> Vec<(u32, u64, u64)> {
        let accounts = self.accounts.lock().unwrap_or_else(|p| p.into_inner());
        let mut usage: Vec<_> = accounts
            .values()
            .map(|a| {
                (
                    a.uid,
                    a.ctl_lines.load(Ordering::Relaxed),
                    a.bytes.load(Ordering::Relaxed),
                )
            })
            .collect();
        usage.sort_unstable();
        usage
    }
}

/// The store is about to write `bytes` of new content: refused with EDQUOT if that would take
/// this thread's payer past its budget. No payer: always room.
pub(crate) fn check_room(bytes: u64) -> std::io::Result<()> {
    check_room_with(|| Ok(bytes))
}

/// [`check_room`] for a size that costs a syscall to learn: `bytes` is asked only when this
/// thread has a payer, so the owner's backups pay nothing for the budget.
pub(crate) fn check_room_with(bytes: impl FnOnce() -> std::io::Result<u64>) -> std::io::Result<()> {
    PAYER.with(|p| match &*p.borrow() {
        Some((account, limits)) => {
            let bytes = bytes()?;
            if account.bytes.load(Ordering::Relaxed).saturating_add(bytes) > limits.bytes {
                Err(over_budget("state bytes", account, limits.bytes))
            } else {
                Ok(())
            }
        }
        None => Ok(()),
    })
}

/// `bytes` were written to the state dir (new store content, a record) for this thread's
/// payer, if any.
pub(crate) fn charge(bytes: u64) {
    PAYER.with(|p| {
        if let Some((account, _)) = &*p.borrow() {
            account.bytes.fetch_add(bytes, Ordering::Relaxed);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budgets_parse_with_units_and_refuse_nonsense() {
        let b: OthersBudget = "1000,8M".parse().unwrap();
        assert_eq!(
            b,
            OthersBudget {
                ctl_lines: 1000,
                bytes: 8 << 20
            }
        );
        assert_eq!("5, 64KiB".parse::<OthersBudget>().unwrap().bytes, 64 << 10);
        assert_eq!("0,0".parse::<OthersBudget>().unwrap().bytes, 0);
        assert_eq!("1,2G".parse::<OthersBudget>().unwrap().bytes, 2 << 30);
        for bad in ["", "1000", "x,8M", "1,8X", "1,-3", "1,99999999999G"] {
            let err = bad.parse::<OthersBudget>().unwrap_err();
            assert!(err.contains("CHECKPOINTS,SIZE"), "{bad}: {err}");
        }
        assert_eq!(OthersBudget::default().to_string(), "1000,8388608");
    }

    #[test]
    fn only_other_users_pay_and_each_within_its_own_budget() {
        let budgets = Budgets::default();
        // Unconfigured: nobody is limited.
        let guard = budgets.pay_as(1234).unwrap();
        check_room(u64::MAX).unwrap();
        drop(guard);
        budgets.configure(
            1000,
            OthersBudget {
                ctl_lines: 3,
                bytes: 100,
            },
        );
        for exempt in [0, 1000] {
            budgets.charge_ctl_lines(exempt, 1_000_000).unwrap();
            let _g = budgets.pay_as(exempt).unwrap();
            check_room(u64::MAX).unwrap();
            charge(1 << 40);
        }
        assert!(budgets.usage().is_empty());

        budgets.charge_ctl_lines(2000, 2).unwrap();
        let e = budgets.charge_ctl_lines(2000, 2).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EDQUOT));
        budgets.charge_ctl_lines(2000, 1).unwrap();
        {
            let _g = budgets.pay_as(2000).unwrap();
            check_room(100).unwrap();
            assert_eq!(
                check_room(101).unwrap_err().raw_os_error(),
                Some(libc::EDQUOT)
            );
            charge(60);
            // Nested (a rename's two names): the inner payer is the same, then restored.
            {
                let _inner = budgets.pay_as(2000).unwrap();
                charge(40);
            }
            assert_eq!(
                check_room(1).unwrap_err().raw_os_error(),
                Some(libc::EDQUOT)
            );
        }
        // The guard is gone: this thread pays for nobody.
        check_room(u64::MAX).unwrap();
        assert_eq!(
            budgets.pay_as(2000).err().and_then(|e| e.raw_os_error()),
            Some(libc::EDQUOT)
        );
        // Another user has its own budget.
        let _g = budgets.pay_as(3000).unwrap();
        check_room(100).unwrap();
        assert_eq!(budgets.usage(), [(2000, 3, 100), (3000, 0, 0)]);
    }
}
