//! The UI's state and key handling, pure: [`Model::update`] takes an [`Event`] (a key, a
//! reply, a tick, a resize) and returns the [`Query`]s to send; nothing here does IO. What is
//! shown is paged: the model asks only for the rows the panes can show (plus a page around),
//! so its cost per key does not grow with the history.
use std::collections::{HashMap, HashSet};

use ratatui::crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
use ratatui::layout::Rect;

use crate::history::browse::{
    Against, ChangesPage, FileDiffAnswer, Head, PathHistory, TimelinePage, TimelineRow,
};
use crate::history::logdiff::LogChange;

/// Rows asked for at once.
pub const PAGE: usize = 100;

/// Something the UI asks its source (the daemon, or a state dir read offline).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Query {
    Head,
    Timeline {
        offset: usize,
        limit: usize,
        session: Option<String>,
    },
    Changes {
        id: String,
        offset: usize,
        limit: usize,
        filter: String,
        session: Option<String>,
    },
    PathHistory {
        path: String,
    },
    Diff {
        id: String,
        path: String,
        against: Against,
    },
    /// What `action` would change (a dry run), and the id that would undo it.
    Preview(Action),
    Act(Action),
}

/// A change to the tree, each done through the daemon's rewind as the CLI does it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// `rewind MNT ID -- PATH`
    RestoreFile { id: String, path: String },
    /// `rewind MNT ID`
    Rewind { id: String },
    /// `rewind MNT ID:before-rewind`: back to before the last rewind.
    UndoRewind { id: String },
}

impl Action {
    /// The checkpoint the tree (or file) is rewound to.
    pub fn target(&self) -> &str {
        match self {
            Action::RestoreFile { id, .. } | Action::Rewind { id } | Action::UndoRewind { id } => {
                id
            }
        }
    }

    pub fn paths(&self) -> Vec<String> {
        match self {
            Action::RestoreFile { path, .. } => vec![path.clone()],
            _ => Vec::new(),
        }
    }

    /// The same action on the command line.
    pub fn cli(&self, target: &str) -> String {
        match self {
            Action::RestoreFile { id, path } => {
                format!("checkpointfs rewind {target} {id} -- {}", shell_word(path))
            }
            Action::Rewind { id } | Action::UndoRewind { id } => {
                format!("checkpointfs rewind {target} {id}")
            }
        }
    }

    fn title(&self) -> &'static str {
        match self {
            Action::RestoreFile { .. } => "Restore this file?",
            Action::Rewind { .. } => "Rewind the whole tree?",
            Action::UndoRewind { .. } => "Undo the last rewind?",
        }
    }
}

/// `s` as one shell word (quoted when it needs to be).
fn shell_word(s: &str) -> String {
    if !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"/._-+:@,=".contains(&b))
    {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

/// What the source answered.
#[derive(Debug, Clone)]
pub enum Reply {
    Head(Head),
    Timeline {
        session: Option<String>,
        page: TimelinePage,
    },
    Changes {
        filter: String,
        session: Option<String>,
        page: ChangesPage,
    },
    PathHistory(PathHistory),
    Diff {
        path: String,
        against: Against,
        answer: Box<FileDiffAnswer>,
    },
    Preview {
        action: Action,
        text: String,
        undo_id: String,
    },
    Done {
        action: Action,
        text: String,
    },
    /// The query failed; the message says why.
    Failed {
        query: Query,
        message: String,
    },
    /// The mount (its daemon) went away.
    Gone(String),
}

#[derive(Debug, Clone)]
pub enum Event {
    Key(KeyEvent),
    Reply(Box<Reply>),
    /// About once a second: poll the head.
    Tick,
    Resize(u16, u16),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Focus {
    Timeline,
    Files,
    Diff,
}

/// Rows by position, loaded a page at a time.
#[derive(Debug, Clone)]
pub struct Paged<T> {
    pub total: Option<usize>,
    pub rows: HashMap<usize, T>,
    /// Page numbers asked for and not yet answered.
    pending: HashSet<usize>,
}

impl<T> Default for Paged<T> {
    fn default() -> Self {
        Paged {
            total: None,
            rows: HashMap::new(),
            pending: HashSet::new(),
        }
    }
}

impl<T> Paged<T> {
    /// The pages covering `from..to` (and the one after) not loaded nor asked for; marks
    /// them asked for.
    fn missing(&mut self, from: usize, to: usize) -> Vec<usize> {
        // Until the first answer tells the total, one page at a time.
        if self.total.is_none() && !self.pending.is_empty() {
            return Vec::new();
        }
        let end = match self.total {
            Some(t) => to.min(t),
            None => to.max(from + 1),
        };
        let mut out = Vec::new();
        if end <= from {
            return out;
        }
        for p in from / PAGE..=(end - 1) / PAGE {
            if !self.rows.contains_key(&(p * PAGE)) && self.pending.insert(p) {
                out.push(p);
            }
        }
        out
    }

    fn fill(&mut self, total: usize, offset: usize, rows: Vec<T>) {
        self.pending.remove(&(offset / PAGE));
        self.total = Some(total);
        for (i, r) in rows.into_iter().enumerate() {
            self.rows.insert(offset + i, r);
        }
    }

    pub fn len(&self) -> usize {
        self.total.unwrap_or(0)
    }
}

/// The diff pane's content.
#[derive(Debug, Clone, Default)]
pub struct DiffPane {
    /// (checkpoint, path, against) it shows or waits for.
    pub key: Option<(String, String, Against)>,
    pub answer: Option<FileDiffAnswer>,
    /// The patch (or a note) split into lines.
    pub lines: Vec<String>,
    pub scroll: usize,
}

/// A confirmation being asked.
#[derive(Debug, Clone)]
pub struct Dialog {
    pub action: Action,
    /// The dry run's report; `None` while it is computed.
    pub preview: Option<String>,
    pub undo_id: Option<String>,
    /// Confirmed, waiting for the daemon.
    pub running: bool,
}

impl Dialog {
    pub fn action_title(&self) -> &'static str {
        self.action.title()
    }
}

/// Browsing the timeline, or one path's history.
#[derive(Debug, Clone)]
pub enum Mode {
    Browse,
    /// Typing a path whose history to show.
    PathPrompt(String),
    History {
        path: String,
        rows: Option<PathHistory>,
        selected: usize,
    },
}

/// The sizes of the panes, from the terminal's; the view draws with the same ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Panes {
    pub header: Rect,
    /// Each pane with its border; `None`: not shown at this size.
    pub timeline: Option<Rect>,
    pub files: Option<Rect>,
    pub diff: Option<Rect>,
    pub status: Rect,
}

/// Below this width (or height) only the focused pane is shown.
pub const WIDE: u16 = 100;
pub const TALL: u16 = 16;

pub fn panes(area: Rect, focus: Focus) -> Panes {
    use ratatui::layout::{Constraint, Layout};
    let [header, body, status] = Layout::vertical([
        Constraint::Length(1),
        Constraint::Min(1),
        Constraint::Length(1),
    ])
    .areas(area);
    if area.width >= WIDE && area.height >= TALL {
        let [left, right] =
            Layout::horizontal([Constraint::Percentage(45), Constraint::Percentage(55)])
                .areas(body);
        let [files, diff] =
            Layout::vertical([Constraint::Percentage(40), Constraint::Percentage(60)]).areas(right);
        Panes {
            header,
            timeline: Some(left),
            files: Some(files),
            diff: Some(diff),
            status,
        }
    } else {
        let mut p = Panes {
            header,
            timeline: None,
            files: None,
            diff: None,
            status,
        };
        match focus {
            Focus::Timeline => p.timeline = Some(body),
            Focus::Files => p.files = Some(body),
            Focus::Diff => p.diff = Some(body),
        }
        p
    }
}

/// Rows inside a bordered pane.
pub fn inner_rows(r: Option<Rect>) -> usize {
    r.map_or(0, |r| usize::from(r.height.saturating_sub(2)))
}

pub struct Model {
    /// MNT, or `--state-dir DIR`, as CLI commands name it.
    pub target: String,
    /// Offline: nothing can be changed.
    pub read_only: bool,
    pub size: (u16, u16),
    pub focus: Focus,
    pub mode: Mode,
    pub head: Option<Head>,
    head_pending: bool,
    pub timeline: Paged<TimelineRow>,
    pub timeline_sel: usize,
    pub timeline_top: usize,
    /// The checkpoint the files pane lists.
    pub files_of: Option<String>,
    pub files: Paged<LogChange>,
    pub files_sel: usize,
    pub files_top: usize,
    pub filter: String,
    pub editing_filter: bool,
    pub diff: DiffPane,
    /// Diffs compare with this; `Next`: what the checkpoint's prompt changed.
    pub against: Against,
    pub session: Option<String>,
    pub dialog: Option<Dialog>,
    pub help: bool,
    /// The status line: the equivalent CLI command, or what an action did.
    pub status: String,
    /// The mount went away: shown instead of the panes.
    pub gone: Option<String>,
    pub quit: bool,
}

impl Model {
    pub fn new(target: String, read_only: bool, size: (u16, u16)) -> Model {
        Model {
            target,
            read_only,
            size,
            focus: Focus::Timeline,
            mode: Mode::Browse,
            head: None,
            head_pending: false,
            timeline: Paged::default(),
            timeline_sel: 0,
            timeline_top: 0,
            files_of: None,
            files: Paged::default(),
            files_sel: 0,
            files_top: 0,
            filter: String::new(),
            editing_filter: false,
            diff: DiffPane::default(),
            against: Against::Next,
            session: None,
            dialog: None,
            help: false,
            status: String::new(),
            gone: None,
            quit: false,
        }
    }

    /// The queries to send at start.
    pub fn start(&mut self) -> Vec<Query> {
        self.head_pending = true;
        let mut q = vec![Query::Head];
        q.extend(self.wanted());
        q
    }

    #[cfg(test)]
    pub fn panes(&self) -> Panes {
        panes(Rect::new(0, 0, self.size.0, self.size.1), self.focus)
    }

    /// Rows the timeline (or history) pane shows, and the files pane.
    fn visible(&self) -> (usize, usize, usize) {
        // At a size that shows one pane at a time, the others are paged as if shown whole.
        let p = panes(Rect::new(0, 0, self.size.0, self.size.1), self.focus);
        let body = usize::from(self.size.1.saturating_sub(4)).max(1);
        let rows = |r: Option<Rect>| match r {
            Some(_) => inner_rows(r).max(1),
            None => body,
        };
        (rows(p.timeline), rows(p.files), rows(p.diff))
    }

    pub fn selected_checkpoint(&self) -> Option<&TimelineRow> {
        self.timeline.rows.get(&self.timeline_sel)
    }

    pub fn selected_change(&self) -> Option<&LogChange> {
        self.files.rows.get(&self.files_sel)
    }

    /// Handles one event; the queries to send.
    pub fn update(&mut self, event: Event) -> Vec<Query> {
        let mut out = match event {
            Event::Key(k) => self.key(k),
            Event::Reply(r) => self.reply(*r),
            Event::Tick if !self.head_pending && self.gone.is_none() => {
                self.head_pending = true;
                vec![Query::Head]
            }
            Event::Tick => Vec::new(),
            Event::Resize(w, h) => {
                self.size = (w, h);
                Vec::new()
            }
        };
        if self.gone.is_none() {
            self.keep_visible();
            out.extend(self.wanted());
        }
        out
    }

    /// What the panes show and is not loaded yet.
    fn wanted(&mut self) -> Vec<Query> {
        let (tl_rows, file_rows, _) = self.visible();
        let mut out = Vec::new();
        if let Mode::History {
            path,
            rows,
            selected,
        } = &self.mode
        {
            if let Some(row) = rows.as_ref().and_then(|h| h.rows.get(*selected)) {
                let (id, path) = (row.id.clone(), path.clone());
                out.extend(self.want_diff(id, path));
            }
            return out;
        }
        for p in self
            .timeline
            .missing(self.timeline_top, self.timeline_top + tl_rows)
        {
            out.push(Query::Timeline {
                offset: p * PAGE,
                limit: PAGE,
                session: self.session.clone(),
            });
        }
        let Some(id) = self.selected_checkpoint().map(|r| r.id.clone()) else {
            return out;
        };
        if self.files_of.as_ref() != Some(&id) {
            self.files_of = Some(id.clone());
            self.files = Paged::default();
            self.files_sel = 0;
            self.files_top = 0;
        }
        for p in self
            .files
            .missing(self.files_top, self.files_top + file_rows)
        {
            out.push(Query::Changes {
                id: id.clone(),
                offset: p * PAGE,
                limit: PAGE,
                filter: self.filter.clone(),
                session: self.session.clone(),
            });
        }
        if let Some(path) = self.selected_change().map(|c| c.path.clone()) {
            out.extend(self.want_diff(id, path));
        } else if self.files.total == Some(0) {
            self.diff = DiffPane::default();
        }
        out
    }

    /// The diff of `path` from checkpoint `id`, unless it is shown or asked for already.
    fn want_diff(&mut self, id: String, path: String) -> Option<Query> {
        let key = (id, path, self.against.clone());
        if self.diff.key.as_ref() == Some(&key) {
            return None;
        }
        self.diff = DiffPane {
            key: Some(key.clone()),
            ..Default::default()
        };
        Some(Query::Diff {
            id: key.0,
            path: key.1,
            against: key.2,
        })
    }

    /// Scrolls the lists so that their selections are shown.
    fn keep_visible(&mut self) {
        let (tl, files, diff) = self.visible();
        fn fit(sel: usize, top: &mut usize, rows: usize) {
            if sel < *top {
                *top = sel;
            } else if sel >= *top + rows {
                *top = sel + 1 - rows;
            }
        }
        fit(self.timeline_sel, &mut self.timeline_top, tl);
        fit(self.files_sel, &mut self.files_top, files);
        let max_scroll = self.diff.lines.len().saturating_sub(diff);
        self.diff.scroll = self.diff.scroll.min(max_scroll);
    }

    fn reply(&mut self, r: Reply) -> Vec<Query> {
        match r {
            Reply::Head(h) => {
                self.head_pending = false;
                let changed = self.head.as_ref().is_none_or(|old| {
                    old.made != h.made || old.latest != h.latest || old.checkpoints != h.checkpoints
                });
                if changed && self.head.is_some() {
                    let added = h
                        .checkpoints
                        .saturating_sub(self.head.as_ref().map_or(0, |o| o.checkpoints));
                    // Stay on the checkpoint shown (new ones come in on top), unless the
                    // newest was: then follow the newest.
                    if self.timeline_sel > 0 {
                        self.timeline_sel += added;
                    }
                    self.reload();
                }
                self.head = Some(h);
            }
            Reply::Timeline { session, page } => {
                if session == self.session {
                    self.timeline.fill(page.total, page.offset, page.rows);
                    let total = self.timeline.len();
                    self.timeline_sel = self.timeline_sel.min(total.saturating_sub(1));
                }
            }
            Reply::Changes {
                filter,
                session,
                page,
            } => {
                if Some(&page.id) == self.files_of.as_ref()
                    && filter == self.filter
                    && session == self.session
                {
                    self.files.fill(page.total, page.offset, page.rows);
                    self.files_sel = self.files_sel.min(self.files.len().saturating_sub(1));
                }
            }
            Reply::PathHistory(h) => {
                if let Mode::History { path, rows, .. } = &mut self.mode
                    && (*path == h.path || path.trim_matches('/') == h.path)
                {
                    if h.rows.is_empty() {
                        self.status = format!(
                            "no checkpoint lists a change of {}",
                            crate::history::quote::quote_name(path)
                        );
                    }
                    *rows = Some(h);
                }
            }
            Reply::Diff {
                path,
                against,
                answer,
            } => {
                let key = (answer.from.clone(), path, against);
                if self.diff.key.as_ref() == Some(&key) {
                    self.diff.lines = diff_lines(&answer);
                    self.diff.answer = Some(*answer);
                    self.diff.scroll = 0;
                }
            }
            Reply::Preview {
                action,
                text,
                undo_id,
            } => {
                if let Some(d) = &mut self.dialog
                    && d.action == action
                {
                    d.preview = Some(text);
                    d.undo_id = Some(undo_id);
                }
            }
            Reply::Done { action, text } => {
                self.dialog = None;
                let summary: Vec<&str> =
                    text.lines().filter(|l| !l.starts_with("would ")).collect();
                // What it did first: the line may be cut at the screen's width.
                self.status = format!("{} (= {})", summary.join("; "), action.cli(&self.target));
                self.reload();
                // The action made a checkpoint (`ID:before-rewind`): learn it now, so that
                // an undo right after names it.
                if !self.head_pending {
                    self.head_pending = true;
                    return vec![Query::Head];
                }
            }
            Reply::Failed { query, message } => {
                match query {
                    Query::Head => self.head_pending = false,
                    Query::Preview(_) | Query::Act(_) => self.dialog = None,
                    Query::Timeline { offset, .. } => {
                        self.timeline.pending.remove(&(offset / PAGE));
                    }
                    Query::Changes { offset, .. } => {
                        self.files.pending.remove(&(offset / PAGE));
                        self.files.total.get_or_insert(0);
                    }
                    Query::Diff { .. } | Query::PathHistory { .. } => {}
                }
                self.status = format!("error: {message}");
            }
            Reply::Gone(message) => self.gone = Some(message),
        }
        Vec::new()
    }

    /// Forgets every loaded page (after a new checkpoint or an action).
    fn reload(&mut self) {
        self.timeline = Paged::default();
        self.files = Paged::default();
        self.files_of = None;
        self.diff = DiffPane::default();
        if let Mode::History { rows, .. } = &mut self.mode {
            *rows = None;
        }
    }

    fn key(&mut self, k: KeyEvent) -> Vec<Query> {
        let ctrl = k.modifiers.contains(KeyModifiers::CONTROL);
        if ctrl && k.code == KeyCode::Char('c') {
            self.quit = true;
            return Vec::new();
        }
        if self.gone.is_some() {
            if matches!(k.code, KeyCode::Char('q') | KeyCode::Esc | KeyCode::Enter) {
                self.quit = true;
            }
            return Vec::new();
        }
        if self.help {
            self.help = false;
            if k.code == KeyCode::Char('q') {
                self.quit = true;
            }
            return Vec::new();
        }
        if let Some(d) = &mut self.dialog {
            match k.code {
                KeyCode::Char('y') | KeyCode::Enter if d.preview.is_some() && !d.running => {
                    d.running = true;
                    self.status = format!("running: {}", d.action.cli(&self.target));
                    return vec![Query::Act(d.action.clone())];
                }
                KeyCode::Char('n') | KeyCode::Esc if !d.running => {
                    self.dialog = None;
                    self.status = "cancelled; nothing was changed".to_string();
                }
                _ => {}
            }
            return Vec::new();
        }
        if self.editing_filter {
            match k.code {
                KeyCode::Enter => self.editing_filter = false,
                KeyCode::Esc => {
                    self.editing_filter = false;
                    self.set_filter(String::new());
                }
                KeyCode::Backspace => {
                    let mut f = self.filter.clone();
                    f.pop();
                    self.set_filter(f);
                }
                KeyCode::Char(c) if !ctrl => {
                    let f = format!("{}{c}", self.filter);
                    self.set_filter(f);
                }
                _ => {}
            }
            return Vec::new();
        }
        if let Mode::PathPrompt(typed) = &mut self.mode {
            match k.code {
                KeyCode::Enter if !typed.is_empty() => {
                    let path = typed.trim_matches('/').to_string();
                    return self.open_history(path);
                }
                KeyCode::Esc => self.mode = Mode::Browse,
                KeyCode::Backspace => {
                    typed.pop();
                }
                KeyCode::Char(c) if !ctrl => typed.push(c),
                _ => {}
            }
            return Vec::new();
        }
        let (tl_rows, file_rows, diff_rows) = self.visible();
        let page = match self.focus {
            Focus::Timeline => tl_rows,
            Focus::Files => file_rows,
            Focus::Diff => diff_rows,
        };
        match k.code {
            KeyCode::Char('q') => self.quit = true,
            KeyCode::Char('?') => self.help = true,
            KeyCode::Esc | KeyCode::Left | KeyCode::Char('h') | KeyCode::Backspace => {
                match (&self.mode, self.focus) {
                    (Mode::History { .. }, Focus::Timeline) => {
                        self.mode = Mode::Browse;
                        self.diff = DiffPane::default();
                    }
                    (_, Focus::Diff) => self.focus = Focus::Files,
                    (Mode::History { .. }, Focus::Files) => self.focus = Focus::Timeline,
                    (_, Focus::Files) => self.focus = Focus::Timeline,
                    (_, Focus::Timeline) if k.code == KeyCode::Esc => self.quit = true,
                    _ => {}
                }
                if matches!(self.mode, Mode::History { .. }) && self.focus == Focus::Files {
                    self.focus = Focus::Timeline;
                }
            }
            KeyCode::Enter | KeyCode::Right | KeyCode::Char('l') => {
                self.focus = match (&self.mode, self.focus) {
                    (Mode::History { .. }, _) => Focus::Diff,
                    (_, Focus::Timeline) => Focus::Files,
                    _ => Focus::Diff,
                }
            }
            KeyCode::Tab => {
                self.focus = match (&self.mode, self.focus) {
                    (Mode::History { .. }, Focus::Timeline) => Focus::Diff,
                    (Mode::History { .. }, _) => Focus::Timeline,
                    (_, Focus::Timeline) => Focus::Files,
                    (_, Focus::Files) => Focus::Diff,
                    (_, Focus::Diff) => Focus::Timeline,
                }
            }
            KeyCode::Down | KeyCode::Char('j') => self.move_by(1),
            KeyCode::Up | KeyCode::Char('k') => self.move_by(-1),
            KeyCode::PageDown | KeyCode::Char(' ') => self.move_by(page as isize),
            KeyCode::PageUp => self.move_by(-(page as isize)),
            KeyCode::Home | KeyCode::Char('g') => self.move_by(isize::MIN / 2),
            KeyCode::End | KeyCode::Char('G') => self.move_by(isize::MAX / 2),
            KeyCode::Char('/') if matches!(self.mode, Mode::Browse) => {
                self.focus = Focus::Files;
                self.editing_filter = true;
            }
            KeyCode::Char('n') => {
                self.against = if self.against == Against::Now {
                    Against::Next
                } else {
                    Against::Now
                };
                self.diff.key = None;
                self.show_diff_command();
            }
            KeyCode::Char('m') => {
                match (self.selected_id(), &self.against) {
                    (Some(id), Against::Checkpoint { id: marked }) if *marked == id => {
                        self.against = Against::Next;
                        self.status = "compare mark cleared".to_string();
                    }
                    (Some(id), _) => {
                        self.against = Against::Checkpoint { id: id.clone() };
                        self.status = format!(
                            "marked {id}: diffs now compare the selected checkpoint with it"
                        );
                    }
                    (None, _) => {}
                }
                self.diff.key = None;
            }
            KeyCode::Char('H') => {
                if let Some(path) = self.selected_change().map(|c| c.path.clone()) {
                    return self.open_history(path);
                }
            }
            KeyCode::Char('p') => self.mode = Mode::PathPrompt(String::new()),
            KeyCode::Char('s') => {
                self.session = match (&self.session, self.selected_checkpoint()) {
                    (Some(_), _) => None,
                    (None, Some(row)) => row.session.clone(),
                    (None, None) => None,
                };
                self.timeline = Paged::default();
                self.timeline_sel = 0;
                self.timeline_top = 0;
                self.files_of = None;
                self.status = match &self.session {
                    Some(s) => format!("checkpointfs log {} --session {s}", self.target),
                    None => format!("checkpointfs log {}", self.target),
                };
            }
            KeyCode::Char('r') if ctrl => self.reload(),
            KeyCode::Char('r') => {
                let action = match &self.mode {
                    Mode::History {
                        path,
                        rows,
                        selected,
                    } => rows
                        .as_ref()
                        .and_then(|h| h.rows.get(*selected))
                        .map(|row| Action::RestoreFile {
                            id: row.id.clone(),
                            path: path.clone(),
                        }),
                    _ => match (self.selected_id(), self.selected_change()) {
                        (Some(id), Some(c)) => Some(Action::RestoreFile {
                            id,
                            path: c.path.clone(),
                        }),
                        _ => None,
                    },
                };
                return self.ask(action);
            }
            KeyCode::Char('R') => {
                let action = self.selected_id().map(|id| Action::Rewind { id });
                return self.ask(action);
            }
            KeyCode::Char('u') => {
                let action = self
                    .head
                    .as_ref()
                    .and_then(|h| h.last_before_rewind.clone())
                    .map(|id| Action::UndoRewind { id });
                if action.is_none() {
                    self.status = "no rewind to undo (no ID:before-rewind checkpoint)".into();
                    return Vec::new();
                }
                return self.ask(action);
            }
            KeyCode::F(5) => self.reload(),
            _ => {}
        }
        Vec::new()
    }

    /// The checkpoint selected in the timeline (or the history).
    fn selected_id(&self) -> Option<String> {
        match &self.mode {
            Mode::History { rows, selected, .. } => rows
                .as_ref()
                .and_then(|h| h.rows.get(*selected))
                .map(|r| r.id.clone()),
            _ => self.selected_checkpoint().map(|r| r.id.clone()),
        }
    }

    fn show_diff_command(&mut self) {
        if let Some(id) = self.selected_id() {
            self.status = match &self.against {
                Against::Now => format!("checkpointfs diff {} {id}", self.target),
                Against::Checkpoint { id: to } => {
                    format!("checkpointfs diff {} {id} {to}", self.target)
                }
                Against::Next => format!("checkpointfs log {}", self.target),
            };
        }
    }

    fn open_history(&mut self, path: String) -> Vec<Query> {
        self.mode = Mode::History {
            path: path.clone(),
            rows: None,
            selected: 0,
        };
        self.focus = Focus::Timeline;
        self.diff = DiffPane::default();
        self.status = format!("history of {}", crate::history::quote::quote_name(&path));
        vec![Query::PathHistory { path }]
    }

    /// Opens the confirmation of `action`, asking for its dry run.
    fn ask(&mut self, action: Option<Action>) -> Vec<Query> {
        let Some(action) = action else {
            self.status = "select a checkpoint (and a file) first".to_string();
            return Vec::new();
        };
        if self.read_only {
            self.status = format!(
                "read-only: {} is a state dir read offline; mount it to rewind",
                self.target
            );
            return Vec::new();
        }
        self.status = action.cli(&self.target);
        self.dialog = Some(Dialog {
            action: action.clone(),
            preview: None,
            undo_id: None,
            running: false,
        });
        vec![Query::Preview(action)]
    }

    fn set_filter(&mut self, f: String) {
        self.filter = f;
        self.files = Paged::default();
        self.files_sel = 0;
        self.files_top = 0;
    }

    fn move_by(&mut self, delta: isize) {
        let step = |sel: usize, len: usize| -> usize {
            let max = len.saturating_sub(1) as isize;
            (sel as isize).saturating_add(delta).clamp(0, max.max(0)) as usize
        };
        match (&mut self.mode, self.focus) {
            (_, Focus::Diff) => {
                let (_, _, rows) = self.visible();
                let len = self.diff.lines.len().saturating_sub(rows) + 1;
                self.diff.scroll = step(self.diff.scroll, len);
            }
            (Mode::History { rows, selected, .. }, _) => {
                let len = rows.as_ref().map_or(0, |h| h.rows.len());
                *selected = step(*selected, len);
            }
            (_, Focus::Timeline) => {
                self.timeline_sel = step(self.timeline_sel, self.timeline.len());
            }
            (_, Focus::Files) => self.files_sel = step(self.files_sel, self.files.len()),
        }
    }
}

/// The diff pane's lines for `answer`: the facts, then the patch or a note.
pub fn diff_lines(answer: &FileDiffAnswer) -> Vec<String> {
    use crate::history::logdiff::ContentChange;
    let to = answer.to.as_deref().unwrap_or("now");
    let Some(d) = &answer.diff else {
        return vec![format!("no difference between {} and {to}", answer.from)];
    };
    let mut out = vec![format!(
        "{} {}  {} → {to}",
        d.change.letter(),
        crate::history::quote::quote_name(&d.path),
        answer.from
    )];
    let side = |f: &Option<crate::history::logdiff::EntryFacts>| match f {
        Some(f) => format!("{:?} {} {} bytes", f.kind, f.mode, f.size).to_lowercase(),
        None => "absent".to_string(),
    };
    out.push(format!("{} → {}", side(&d.before), side(&d.after)));
    match d.content {
        ContentChange::Binary => out.push(format!(
            "binary file: {} -> {} bytes (no text diff)",
            d.before.as_ref().map_or(0, |f| f.size),
            d.after.as_ref().map_or(0, |f| f.size)
        )),
        ContentChange::None => out.push("no content change (mode or type only)".to_string()),
        ContentChange::Large => out.push(format!(
            "large file: {} bytes changed (`checkpointfs diff --full` diffs it by lines)",
            d.bytes_changed.unwrap_or(0)
        )),
        ContentChange::Text => {
            out.push(format!("+{} -{}", d.insertions, d.deletions));
            if let Some(p) = &d.patch {
                out.extend(p.lines().map(str::to_string));
            }
        }
    }
    out
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::history::browse::BROWSE_SCHEMA;
    use crate::history::changes::ChangeKind;
    use crate::history::logdiff::{ContentChange, FileDiff, Timestamp};

    pub fn key(c: char) -> Event {
        Event::Key(KeyEvent::new(KeyCode::Char(c), KeyModifiers::NONE))
    }

    pub fn code(c: KeyCode) -> Event {
        Event::Key(KeyEvent::new(c, KeyModifiers::NONE))
    }

    pub fn row(i: usize) -> TimelineRow {
        TimelineRow {
            id: format!("c{i}"),
            time: Timestamp {
                time: "2026-12-07T10:38:22.123Z".into(),
                time_unix_ns: 0,
            },
            session: Some(format!("sess{}abcdef", i % 3)),
            added: 1,
            modified: 2,
            deleted: 0,
            insertions: Some(10),
            deletions: Some(3),
            actors: vec!["bash".into(), "sed".into()],
        }
    }

    pub fn change(path: &str) -> LogChange {
        LogChange {
            path: path.into(),
            change: ChangeKind::Modified,
            actors: vec!["sed".into()],
            sessions: vec![],
            before: None,
            after: None,
        }
    }

    /// A timeline of `total` checkpoints, newest `c{total-1}` first, answering `q`.
    pub fn timeline_reply(q: &Query, total: usize) -> Option<Event> {
        let Query::Timeline {
            offset,
            limit,
            session,
        } = q
        else {
            return None;
        };
        let rows = (*offset..(*offset + *limit).min(total))
            .map(|pos| row(total - 1 - pos))
            .collect();
        Some(Event::Reply(Box::new(Reply::Timeline {
            session: session.clone(),
            page: TimelinePage {
                schema: BROWSE_SCHEMA.into(),
                total,
                offset: *offset,
                rows,
            },
        })))
    }

    pub fn changes_reply(q: &Query, paths: &[String]) -> Option<Event> {
        let Query::Changes {
            id,
            offset,
            limit,
            filter,
            session,
        } = q
        else {
            return None;
        };
        let matching: Vec<&String> = paths
            .iter()
            .filter(|p| p.contains(filter.as_str()))
            .collect();
        Some(Event::Reply(Box::new(Reply::Changes {
            filter: filter.clone(),
            session: session.clone(),
            page: ChangesPage {
                schema: BROWSE_SCHEMA.into(),
                id: id.clone(),
                total: matching.len(),
                offset: *offset,
                rows: matching
                    .iter()
                    .skip(*offset)
                    .take(*limit)
                    .map(|p| change(p))
                    .collect(),
            },
        })))
    }

    pub fn diff_reply(q: &Query, patch: &str) -> Option<Event> {
        let Query::Diff { id, path, against } = q else {
            return None;
        };
        Some(Event::Reply(Box::new(Reply::Diff {
            path: path.clone(),
            against: against.clone(),
            answer: Box::new(FileDiffAnswer {
                schema: BROWSE_SCHEMA.into(),
                from: id.clone(),
                to: None,
                diff: Some(FileDiff {
                    path: path.clone(),
                    change: ChangeKind::Modified,
                    before: None,
                    after: None,
                    content: ContentChange::Text,
                    insertions: 1,
                    deletions: 1,
                    patch: Some(patch.to_string()),
                    bytes_changed: None,
                }),
            }),
        })))
    }

    /// Feeds `event`, then answers every query the way a source with `total` checkpoints
    /// and `paths` in each would, until nothing is asked; the queries asked.
    pub fn drive(m: &mut Model, event: Event, total: usize, paths: &[String]) -> Vec<Query> {
        let mut asked = Vec::new();
        let mut queue = m.update(event);
        while let Some(q) = queue.pop() {
            asked.push(q.clone());
            let answer = timeline_reply(&q, total)
                .or_else(|| changes_reply(&q, paths))
                .or_else(|| diff_reply(&q, "@@ -1 +1 @@\n-old\n+new\n"));
            if let Some(a) = answer {
                queue.extend(m.update(a));
            }
        }
        asked
    }

    pub fn loaded(total: usize, paths: &[String], size: (u16, u16)) -> Model {
        let mut m = Model::new("/mnt".into(), false, size);
        let start = m.start();
        for q in start {
            if let Some(a) = timeline_reply(&q, total) {
                drive(&mut m, a, total, paths);
            }
        }
        m
    }

    fn paths(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("dir/file{i:06}.rs")).collect()
    }

    #[test]
    fn start_asks_for_the_head_and_the_first_page_only() {
        let mut m = Model::new("/mnt".into(), false, (120, 40));
        assert_eq!(
            m.start(),
            vec![
                Query::Head,
                Query::Timeline {
                    offset: 0,
                    limit: PAGE,
                    session: None
                }
            ]
        );
    }

    #[test]
    fn selecting_loads_files_and_the_first_file_s_diff() {
        let m = loaded(10_000, &paths(3), (120, 40));
        assert_eq!(m.selected_checkpoint().unwrap().id, "c9999");
        assert_eq!(m.files_of.as_deref(), Some("c9999"));
        assert_eq!(m.files.len(), 3);
        assert_eq!(
            m.diff.key,
            Some(("c9999".into(), "dir/file000000.rs".into(), Against::Next))
        );
        assert!(
            m.diff.lines.iter().any(|l| l == "+new"),
            "{:?}",
            m.diff.lines
        );
    }

    #[test]
    fn moving_down_past_a_page_asks_for_the_next_page_only() {
        let mut m = loaded(10_000, &paths(3), (120, 40));
        let mut asked = Vec::new();
        for _ in 0..PAGE {
            asked.extend(drive(&mut m, key('j'), 10_000, &paths(3)));
        }
        let pages: Vec<&Query> = asked
            .iter()
            .filter(|q| matches!(q, Query::Timeline { .. }))
            .collect();
        assert_eq!(
            pages,
            vec![&Query::Timeline {
                offset: PAGE,
                limit: PAGE,
                session: None
            }]
        );
        assert_eq!(
            m.selected_checkpoint().unwrap().id,
            format!("c{}", 9999 - PAGE)
        );
        drive(&mut m, code(KeyCode::End), 10_000, &paths(3));
        assert_eq!(m.selected_checkpoint().unwrap().id, "c0");
    }

    #[test]
    fn typing_a_filter_asks_for_matching_paths() {
        let all = paths(1000);
        let mut m = loaded(5, &all, (120, 40));
        drive(&mut m, key('/'), 5, &all);
        assert!(m.editing_filter);
        let asked = drive(&mut m, key('9'), 5, &all);
        assert!(
            asked
                .iter()
                .any(|q| matches!(q, Query::Changes { filter, .. } if filter == "9"))
        );
        for c in "99".chars() {
            drive(&mut m, key(c), 5, &all);
        }
        assert_eq!(m.filter, "999");
        assert_eq!(m.files.len(), 1);
        assert_eq!(m.selected_change().unwrap().path, "dir/file000999.rs");
        // q is typed into the filter, not quitting.
        drive(&mut m, key('q'), 5, &all);
        assert!(!m.quit);
        drive(&mut m, code(KeyCode::Esc), 5, &all);
        assert_eq!(m.filter, "");
        assert!(!m.editing_filter);
        assert_eq!(m.files.len(), 1000);
    }

    #[test]
    fn restore_asks_for_a_dry_run_then_confirmation_then_acts() {
        let all = paths(2);
        let mut m = loaded(3, &all, (120, 40));
        drive(&mut m, code(KeyCode::Enter), 3, &all);
        assert_eq!(m.focus, Focus::Files);
        drive(&mut m, key('j'), 3, &all);
        let asked = drive(&mut m, key('r'), 3, &all);
        let action = Action::RestoreFile {
            id: "c2".into(),
            path: "dir/file000001.rs".into(),
        };
        assert_eq!(asked, vec![Query::Preview(action.clone())]);
        assert_eq!(m.status, "checkpointfs rewind /mnt c2 -- dir/file000001.rs");
        // Not confirmable before the dry run is shown.
        assert!(m.update(key('y')).is_empty());
        m.update(Event::Reply(Box::new(Reply::Preview {
            action: action.clone(),
            text: "would rewrite  dir/file000001.rs\n".into(),
            undo_id: "c2:before-rewind".into(),
        })));
        assert_eq!(m.update(key('y')), vec![Query::Act(action.clone())]);
        m.update(Event::Reply(Box::new(Reply::Done {
            action,
            text: "saved current state as c2:before-rewind\nrewound to c2: 1 path changed\n".into(),
        })));
        assert!(m.dialog.is_none());
        assert!(
            m.status.contains("saved current state as c2:before-rewind"),
            "{}",
            m.status
        );
    }

    #[test]
    fn cancel_changes_nothing_and_offline_refuses_actions() {
        let all = paths(1);
        let mut m = loaded(3, &all, (120, 40));
        drive(&mut m, key('R'), 3, &all);
        assert!(m.dialog.is_some());
        assert!(drive(&mut m, code(KeyCode::Esc), 3, &all).is_empty());
        assert!(m.dialog.is_none() && !m.quit);
        m.read_only = true;
        assert!(drive(&mut m, key('R'), 3, &all).is_empty());
        assert!(m.status.starts_with("read-only"), "{}", m.status);
    }

    #[test]
    fn undo_rewinds_to_the_last_before_rewind_checkpoint() {
        let mut m = loaded(3, &paths(1), (120, 40));
        m.update(key('u'));
        assert!(m.status.starts_with("no rewind to undo"));
        m.update(Event::Reply(Box::new(Reply::Head(Head {
            last_before_rewind: Some("c1:before-rewind".into()),
            ..Default::default()
        }))));
        let q = m.update(key('u'));
        assert!(q.contains(&Query::Preview(Action::UndoRewind {
            id: "c1:before-rewind".into()
        })));
    }

    #[test]
    fn a_new_checkpoint_reloads_and_ticks_poll_once_at_a_time() {
        let all = paths(1);
        let mut m = loaded(3, &all, (120, 40));
        // The start's head query is outstanding: a tick asks nothing more.
        assert!(m.update(Event::Tick).is_empty());
        let head = |n: usize| Head {
            checkpoints: n,
            made: n,
            latest: Some(format!("c{}", n - 1)),
            ..Default::default()
        };
        drive(
            &mut m,
            Event::Reply(Box::new(Reply::Head(head(3)))),
            3,
            &all,
        );
        assert_eq!(m.update(Event::Tick), vec![Query::Head]);
        let asked = drive(
            &mut m,
            Event::Reply(Box::new(Reply::Head(head(4)))),
            4,
            &all,
        );
        assert!(
            asked
                .iter()
                .any(|q| matches!(q, Query::Timeline { offset: 0, .. }))
        );
        assert_eq!(m.selected_checkpoint().unwrap().id, "c3");
    }

    #[test]
    fn the_diff_pane_scrolls_within_its_lines() {
        let all = paths(1);
        let mut m = loaded(3, &all, (120, 40));
        m.diff.lines = (0..100).map(|i| format!("line {i}")).collect();
        m.focus = Focus::Diff;
        m.update(key('j'));
        assert_eq!(m.diff.scroll, 1);
        m.update(code(KeyCode::End));
        let rows = inner_rows(m.panes().diff);
        assert_eq!(m.diff.scroll, 100 - rows);
        m.update(code(KeyCode::Home));
        assert_eq!(m.diff.scroll, 0);
    }

    #[test]
    fn compare_with_now_and_with_a_marked_checkpoint() {
        let all = paths(1);
        let mut m = loaded(3, &all, (120, 40));
        let asked = drive(&mut m, key('n'), 3, &all);
        assert!(asked.iter().any(|q| matches!(
            q,
            Query::Diff {
                against: Against::Now,
                ..
            }
        )));
        assert_eq!(m.status, "checkpointfs diff /mnt c2");
        drive(&mut m, key('m'), 3, &all);
        drive(&mut m, key('j'), 3, &all);
        let d = m.diff.key.clone().unwrap();
        assert_eq!(d.0, "c1");
        assert_eq!(d.2, Against::Checkpoint { id: "c2".into() });
    }

    #[test]
    fn file_history_then_back() {
        let all = paths(1);
        let mut m = loaded(3, &all, (120, 40));
        let q = m.update(key('H'));
        assert_eq!(
            q,
            vec![Query::PathHistory {
                path: "dir/file000000.rs".into()
            }]
        );
        assert!(matches!(m.mode, Mode::History { .. }));
        m.update(code(KeyCode::Esc));
        assert!(matches!(m.mode, Mode::Browse));
        assert!(!m.quit);
        m.update(code(KeyCode::Esc));
        assert!(m.quit);
    }

    #[test]
    fn an_empty_list_is_asked_for_once() {
        let mut m = loaded(3, &[], (120, 40));
        assert_eq!(m.files.total, Some(0));
        let asked = drive(&mut m, code(KeyCode::Down), 3, &[]);
        assert_eq!(asked.len(), 1, "{asked:?}");
        assert!(matches!(&asked[0], Query::Changes { id, .. } if id == "c1"));
        m.focus = Focus::Files;
        assert!(drive(&mut m, key('j'), 3, &[]).is_empty());
    }

    #[test]
    fn a_vanished_mount_stops_asking_and_q_quits() {
        let mut m = loaded(3, &paths(1), (120, 40));
        m.update(Event::Reply(Box::new(Reply::Gone("daemon gone".into()))));
        assert!(m.update(Event::Tick).is_empty());
        assert!(m.update(key('j')).is_empty());
        m.update(key('q'));
        assert!(m.quit);
    }
}
