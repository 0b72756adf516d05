//! Where the UI's [`Query`]s are answered: the daemon over its control socket (a mount), or
//! a state dir read offline (`--state-dir`, read-only), both through `history::browse`. A
//! worker thread answers them in order so that the UI never waits on one; of several queued
//! queries for one pane only the last is answered (the others are out of date already).
use std::io;
use std::path::PathBuf;

use crossbeam_channel::{Receiver, Sender};
use serde::de::DeserializeOwned;

use super::model::{Action, Query, Reply};
use crate::history::History;
use crate::mount::control_socket::{self, Request};

pub enum Source {
    Daemon { state_dir: PathBuf },
    Offline(std::sync::Arc<History>),
}

/// Whether a failed request means the daemon is gone (not merely that it refused).
fn is_gone(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::NotFound
            | io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::UnexpectedEof
            | io::ErrorKind::BrokenPipe
    )
}

enum Failure {
    Gone(String),
    Refused(String),
}

impl From<io::Error> for Failure {
    fn from(e: io::Error) -> Failure {
        Failure::Refused(e.to_string())
    }
}

impl Source {
    fn ask(&self, req: &Request) -> Result<String, Failure> {
        let Source::Daemon { state_dir } = self else {
            return Err(Failure::Refused("no daemon".into()));
        };
        match control_socket::request(state_dir, req) {
            Ok(r) if r.ok => Ok(r.output),
            Ok(r) => Err(Failure::Refused(r.error)),
            Err(e) if is_gone(&e) => Err(Failure::Gone(e.to_string())),
            Err(e) => Err(Failure::Refused(e.to_string())),
        }
    }

    fn doc<T: DeserializeOwned>(&self, req: &Request) -> Result<T, Failure> {
        let text = self.ask(req)?;
        serde_json::from_str(&text)
            .map_err(|e| Failure::Refused(format!("bad answer from the daemon: {e}")))
    }

    fn offline(&self) -> Option<&History> {
        match self {
            Source::Offline(h) => Some(h),
            Source::Daemon { .. } => None,
        }
    }

    fn rewind(&self, action: &Action, dry_run: bool) -> Request {
        Request::Rewind {
            id: action.target().to_string(),
            dry_run,
            paths: action.paths(),
            rewind_agent_state: false,
            progress: false,
        }
    }

    /// Answers one query.
    pub fn answer(&self, q: Query) -> Reply {
        match self.try_answer(&q) {
            Ok(r) => r,
            Err(Failure::Gone(message)) => Reply::Gone(message),
            Err(Failure::Refused(message)) => Reply::Failed { query: q, message },
        }
    }

    fn try_answer(&self, q: &Query) -> Result<Reply, Failure> {
        let h = self.offline();
        Ok(match q.clone() {
            Query::Head => Reply::Head(match h {
                Some(h) => h.browse_head(),
                None => self.doc(&Request::BrowseHead)?,
            }),
            Query::Timeline {
                offset,
                limit,
                session,
            } => {
                let page = match h {
                    Some(h) => h.timeline_page(offset, limit, session.as_deref())?,
                    None => self.doc(&Request::BrowseTimeline {
                        offset,
                        limit,
                        session: session.clone(),
                    })?,
                };
                Reply::Timeline { session, page }
            }
            Query::Changes {
                id,
                offset,
                limit,
                filter,
                session,
            } => {
                let page = match h {
                    Some(h) => h.changes_page(&id, offset, limit, &filter, session.as_deref())?,
                    None => self.doc(&Request::BrowseChanges {
                        id,
                        offset,
                        limit,
                        filter: filter.clone(),
                        session: session.clone(),
                    })?,
                };
                Reply::Changes {
                    filter,
                    session,
                    page,
                }
            }
            Query::PathHistory { path } => Reply::PathHistory(match h {
                Some(h) => h.path_history(&path)?,
                None => self.doc(&Request::BrowsePath { path })?,
            }),
            Query::Diff { id, path, against } => {
                let answer = match h {
                    Some(h) => h.file_diff_of(&id, &path, &against)?,
                    None => self.doc(&Request::BrowseDiff {
                        id,
                        path: path.clone(),
                        against: against.clone(),
                    })?,
                };
                Reply::Diff {
                    path,
                    against,
                    answer: Box::new(answer),
                }
            }
            Query::Preview(action) => {
                let text = self.ask(&self.rewind(&action, true))?;
                let undo_id = self.ask(&Request::UndoId {
                    id: action.target().to_string(),
                })?;
                Reply::Preview {
                    action,
                    text,
                    undo_id,
                }
            }
            Query::Act(action) => {
                let text = self.ask(&self.rewind(&action, false))?;
                Reply::Done { action, text }
            }
        })
    }
}

/// Whether `later`, queued after `q`, makes `q`'s answer useless: the model drops answers
/// for a pane that moved on (a page of another checkpoint's or filter's files, the diff of
/// another file), and resets what it waits for then.
fn superseded(q: &Query, later: &Query) -> bool {
    match (q, later) {
        (
            Query::Changes {
                id,
                filter,
                session,
                ..
            },
            Query::Changes {
                id: i2,
                filter: f2,
                session: s2,
                ..
            },
        ) => (id, filter, session) != (i2, f2, s2),
        (Query::Diff { .. }, Query::Diff { .. }) => true,
        (Query::PathHistory { .. }, Query::PathHistory { .. }) => true,
        _ => false,
    }
}

/// Answers queries from `queries` until it closes, each reply to `replies`.
pub fn serve(source: Source, queries: Receiver<Query>, replies: Sender<Reply>) {
    while let Ok(first) = queries.recv() {
        let mut batch = vec![first];
        batch.extend(queries.try_iter());
        for (i, q) in batch.iter().enumerate() {
            if batch[i + 1..].iter().any(|later| superseded(q, later)) {
                continue;
            }
            if replies.send(source.answer(q.clone())).is_err() {
                return;
            }
        }
    }
}
