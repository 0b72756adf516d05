//! Drawing the [`Model`]: only the rows each pane shows are built, so a frame costs the
//! terminal's size, not the history's. Names go through [`quote_name`] as in the CLI's text
//! output, and file content through [`printable`], so nothing shown can move the cursor.
use ratatui::Frame;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Clear, Paragraph, Wrap};

use super::model::{Focus, Mode, Model, inner_rows};
use crate::history::browse::{Against, TimelineRow};
use crate::history::quote::quote_name;

/// Styles, all plain under `NO_COLOR`.
#[derive(Debug, Clone, Copy)]
pub struct Theme {
    pub color: bool,
}

impl Theme {
    /// Colour unless `NO_COLOR` is set to anything non-empty (no-color.org).
    pub fn from_env() -> Theme {
        Theme {
            color: std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty()),
        }
    }

    fn fg(&self, c: Color) -> Style {
        if self.color {
            Style::default().fg(c)
        } else {
            Style::default()
        }
    }

    /// The selected row: reverse video, which needs no colour.
    fn selected(&self) -> Style {
        Style::default().add_modifier(Modifier::REVERSED)
    }
}

/// Control characters of file content as visible text (`\t` as spaces).
pub fn printable(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '\t' => out.push_str("    "),
            c if c.is_control() => out.push_str(&format!("\\x{:02x}", u32::from(c))),
            c => out.push(c),
        }
    }
    out
}

/// `2026-12-07T10:38:22.123Z` → `12-07 10:38:22`.
fn short_time(t: &str) -> String {
    t.get(5..19)
        .map_or_else(|| t.to_string(), |s| s.replacen('T', " ", 1))
}

fn short_session(s: &Option<String>) -> String {
    match s {
        Some(s) => s.chars().take(8).collect(),
        None => "-".to_string(),
    }
}

/// One timeline row: `id  time  session  A1 M2 D0  +10 -3  by bash, sed`.
pub fn timeline_text(r: &TimelineRow) -> String {
    let lines = match (r.insertions, r.deletions) {
        (Some(i), Some(d)) => format!("+{i} -{d}"),
        _ => "+? -?".to_string(),
    };
    let by = if r.actors.is_empty() {
        String::new()
    } else {
        format!("  by {}", r.actors.join(", "))
    };
    let event = if r.id.contains(":before-rewind") {
        " [rewind]"
    } else {
        ""
    };
    format!(
        "{}{event}  {}  {}  A{} M{} D{}  {lines}{by}",
        quote_name(&r.id),
        short_time(&r.time.time),
        short_session(&r.session),
        r.added,
        r.modified,
        r.deleted,
    )
}

fn block(title: String, focused: bool, theme: Theme) -> Block<'static> {
    let style = if focused {
        theme.fg(Color::Yellow).add_modifier(Modifier::BOLD)
    } else {
        Style::default()
    };
    Block::default()
        .borders(Borders::ALL)
        .title(Span::styled(title, style))
}

/// Draws the whole screen.
pub fn draw(frame: &mut Frame, m: &Model, theme: Theme) {
    let area = frame.area();
    if let Some(msg) = &m.gone {
        let text = vec![
            Line::from("The mount went away while the UI was open:"),
            Line::from(printable(msg)),
            Line::from(""),
            Line::from("Nothing more can be shown. Press q to quit."),
        ];
        frame.render_widget(
            Paragraph::new(text).wrap(Wrap { trim: false }).block(block(
                format!("checkpointfs ui {}", m.target),
                true,
                theme,
            )),
            area,
        );
        return;
    }
    let p = super::model::panes(area, m.focus);
    let header = match &m.head {
        Some(h) => format!(
            "checkpointfs ui {}  {} checkpoints{}{}  ? help",
            m.target,
            h.checkpoints,
            m.session.as_ref().map_or(String::new(), |s| format!(
                "  session {}",
                short_session(&Some(s.clone()))
            )),
            match &m.against {
                Against::Next => String::new(),
                Against::Now => "  vs now".to_string(),
                Against::Checkpoint { id } => format!("  vs {id}"),
            }
        ),
        None => format!("checkpointfs ui {}  loading…  ? help", m.target),
    };
    frame.render_widget(
        Paragraph::new(header).style(theme.fg(Color::Cyan)),
        p.header,
    );
    match &m.mode {
        Mode::History {
            path,
            rows,
            selected,
        } => {
            if let Some(r) = p.timeline {
                draw_history(frame, r, m, path, rows.as_ref(), *selected, theme);
            }
            // The files pane's place shows the diff too: there is no file list here.
            let diff_area = match (p.files, p.diff) {
                (Some(f), Some(d)) => Some(Rect::new(f.x, f.y, f.width, f.height + d.height)),
                (Some(f), None) => Some(f),
                (None, d) => d,
            };
            if let Some(r) = diff_area {
                draw_diff(frame, r, m, theme);
            }
        }
        _ => {
            if let Some(r) = p.timeline {
                draw_timeline(frame, r, m, theme);
            }
            if let Some(r) = p.files {
                draw_files(frame, r, m, theme);
            }
            if let Some(r) = p.diff {
                draw_diff(frame, r, m, theme);
            }
        }
    }
    let status = match &m.mode {
        Mode::PathPrompt(typed) => format!("history of path: {}_", printable(typed)),
        _ if m.editing_filter => format!(
            "filter: {}_  (Enter keeps, Esc clears)",
            printable(&m.filter)
        ),
        _ => printable(&m.status),
    };
    frame.render_widget(
        Paragraph::new(status).style(Style::default().add_modifier(Modifier::BOLD)),
        p.status,
    );
    if let Some(d) = &m.dialog {
        draw_dialog(frame, area, m, d, theme);
    } else if m.help {
        draw_help(frame, area, theme);
    }
}

fn draw_timeline(frame: &mut Frame, r: Rect, m: &Model, theme: Theme) {
    let rows = inner_rows(Some(r));
    let mut lines = Vec::with_capacity(rows);
    for pos in m.timeline_top..(m.timeline_top + rows).min(m.timeline.len()) {
        let text = match m.timeline.rows.get(&pos) {
            Some(row) => timeline_text(row),
            None => "…".to_string(),
        };
        let style = if pos == m.timeline_sel {
            theme.selected()
        } else if text.contains(" [rewind]") {
            theme.fg(Color::Magenta)
        } else {
            Style::default()
        };
        lines.push(Line::styled(text, style));
    }
    if m.timeline.total == Some(0) {
        lines.push(Line::from("no checkpoints yet"));
    }
    let title = format!(
        "Timeline {}/{}",
        (m.timeline_sel + 1).min(m.timeline.len()),
        m.timeline.len()
    );
    frame.render_widget(
        Paragraph::new(lines).block(block(title, m.focus == Focus::Timeline, theme)),
        r,
    );
}

fn draw_files(frame: &mut Frame, r: Rect, m: &Model, theme: Theme) {
    let rows = inner_rows(Some(r));
    let mut lines = Vec::with_capacity(rows);
    for pos in m.files_top..(m.files_top + rows).min(m.files.len()) {
        let line = match m.files.rows.get(&pos) {
            Some(c) => {
                let kind = |f: &Option<crate::history::logdiff::EntryFacts>| {
                    f.as_ref().map(|f| (f.kind, f.mode.clone()))
                };
                let mut note = String::new();
                if let (Some(a), Some(b)) = (kind(&c.before), kind(&c.after)) {
                    if a.0 != b.0 {
                        note = format!("  ({:?} -> {:?})", a.0, b.0).to_lowercase();
                    } else if a.1 != b.1 {
                        note = format!("  (mode {} -> {})", a.1, b.1);
                    }
                }
                let by = if c.actors.is_empty() {
                    String::new()
                } else {
                    format!("  by {}", c.actors.join(", "))
                };
                let letter = c.change.letter();
                let color = match letter {
                    'A' => Color::Green,
                    'D' => Color::Red,
                    _ => Color::Yellow,
                };
                let style = if pos == m.files_sel {
                    theme.selected()
                } else {
                    Style::default()
                };
                Line::from(vec![
                    Span::styled(format!("{letter} "), style.patch(theme.fg(color))),
                    Span::styled(format!("{}{note}{by}", quote_name(&c.path)), style),
                ])
            }
            None => Line::from("…"),
        };
        lines.push(line);
    }
    if m.files.total == Some(0) {
        lines.push(Line::from(if m.filter.is_empty() {
            "no changes listed"
        } else {
            "no path matches the filter"
        }));
    }
    let id = m.files_of.as_deref().unwrap_or("");
    let filter = if m.filter.is_empty() {
        String::new()
    } else {
        format!(" /{}", printable(&m.filter))
    };
    let title = format!("Files of {}{filter} {}", quote_name(id), m.files.len());
    frame.render_widget(
        Paragraph::new(lines).block(block(title, m.focus == Focus::Files, theme)),
        r,
    );
}

fn draw_diff(frame: &mut Frame, r: Rect, m: &Model, theme: Theme) {
    let rows = inner_rows(Some(r));
    let lines: Vec<Line> = if m.diff.key.is_some() && m.diff.answer.is_none() {
        vec![Line::from("loading…")]
    } else {
        m.diff
            .lines
            .iter()
            .skip(m.diff.scroll)
            .take(rows)
            .map(|l| {
                let style = if l.starts_with("@@") {
                    theme.fg(Color::Cyan)
                } else if l.starts_with('+') {
                    theme.fg(Color::Green)
                } else if l.starts_with('-') {
                    theme.fg(Color::Red)
                } else {
                    Style::default()
                };
                Line::styled(printable(l), style)
            })
            .collect()
    };
    let title = match &m.diff.key {
        Some((_, path, _)) => format!("Diff {}", quote_name(path)),
        None => "Diff".to_string(),
    };
    frame.render_widget(
        Paragraph::new(lines).block(block(title, m.focus == Focus::Diff, theme)),
        r,
    );
}

fn draw_history(
    frame: &mut Frame,
    r: Rect,
    m: &Model,
    path: &str,
    rows: Option<&crate::history::browse::PathHistory>,
    selected: usize,
    theme: Theme,
) {
    let shown = inner_rows(Some(r));
    let lines: Vec<Line> = match rows {
        None => vec![Line::from("loading…")],
        Some(h) if h.rows.is_empty() => vec![Line::from("no checkpoint lists a change of it")],
        Some(h) => {
            let top = selected.saturating_sub(shown.saturating_sub(1));
            h.rows
                .iter()
                .enumerate()
                .skip(top)
                .take(shown)
                .map(|(i, row)| {
                    let by = if row.actors.is_empty() {
                        String::new()
                    } else {
                        format!("  by {}", row.actors.join(", "))
                    };
                    let text = format!(
                        "{} {}  {}  {}{by}",
                        row.change.letter(),
                        quote_name(&row.id),
                        short_time(&row.time.time),
                        short_session(&row.session)
                    );
                    let style = if i == selected {
                        theme.selected()
                    } else {
                        Style::default()
                    };
                    Line::styled(text, style)
                })
                .collect()
        }
    };
    let title = format!("History of {}", quote_name(path));
    frame.render_widget(
        Paragraph::new(lines).block(block(title, m.focus == Focus::Timeline, theme)),
        r,
    );
}

/// A box of `w`×`h` (at most the area) in the middle of `area`.
fn centered(area: Rect, w: u16, h: u16) -> Rect {
    let w = w.min(area.width);
    let h = h.min(area.height);
    let [_, mid, _] = Layout::vertical([
        Constraint::Fill(1),
        Constraint::Length(h),
        Constraint::Fill(1),
    ])
    .areas(area);
    let [_, c, _] = Layout::horizontal([
        Constraint::Fill(1),
        Constraint::Length(w),
        Constraint::Fill(1),
    ])
    .areas(mid);
    c
}

fn draw_dialog(frame: &mut Frame, area: Rect, m: &Model, d: &super::model::Dialog, theme: Theme) {
    let mut lines = vec![Line::styled(
        d.action.cli(&m.target),
        Style::default().add_modifier(Modifier::BOLD),
    )];
    match &d.preview {
        None => lines.push(Line::from("checking what it would change…")),
        Some(text) => {
            lines.extend(text.lines().map(|l| Line::from(printable(l))));
            if let Some(undo) = &d.undo_id {
                lines.push(Line::from("saves the current state first; undo with:"));
                lines.push(Line::from(format!(
                    "  checkpointfs rewind {} {}",
                    m.target,
                    quote_name(undo)
                )));
            }
            lines.push(Line::styled(
                if d.running {
                    "running…"
                } else {
                    "y/Enter: do it   n/Esc: cancel"
                },
                theme.fg(Color::Yellow),
            ));
        }
    }
    let widest = lines.iter().map(Line::width).max().unwrap_or(0);
    let width = u16::try_from(widest + 2).unwrap_or(u16::MAX).max(40);
    // Wrapped lines need more rows: a generous estimate, bounded by the screen.
    let rows = lines.len() + widest / usize::from(area.width.max(1));
    let r = centered(area, width, u16::try_from(rows + 2).unwrap_or(u16::MAX));
    frame.render_widget(Clear, r);
    frame.render_widget(
        Paragraph::new(lines)
            .wrap(Wrap { trim: false })
            .block(block(d.action_title().to_string(), true, theme)),
        r,
    );
}

/// The keys, as `?` shows them.
pub const HELP: &[(&str, &str)] = &[
    ("j/k ↑/↓", "move; PgUp/PgDn, g/G: page, first/last"),
    ("Enter l →", "into the files, then the diff"),
    ("Esc h ←", "back (Esc on the timeline quits)"),
    ("Tab", "next pane"),
    ("/", "filter the files by typing"),
    ("n", "diff against now (again: against the next checkpoint)"),
    (
        "m",
        "mark a checkpoint; diffs compare the selected one with it",
    ),
    ("H", "history of the selected file"),
    ("p", "history of a path you type"),
    ("r", "restore the selected file to the selected checkpoint"),
    ("R", "rewind the whole tree to the selected checkpoint"),
    ("u", "undo the last rewind"),
    ("s", "only the selected checkpoint's session (again: all)"),
    ("F5", "reload"),
    ("q", "quit"),
];

fn draw_help(frame: &mut Frame, area: Rect, theme: Theme) {
    let lines: Vec<Line> = HELP
        .iter()
        .map(|(k, what)| {
            Line::from(vec![
                Span::styled(format!("{k:<10} "), theme.fg(Color::Yellow)),
                Span::raw(*what),
            ])
        })
        .collect();
    let r = centered(area, 72, HELP.len() as u16 + 2);
    frame.render_widget(Clear, r);
    frame.render_widget(
        Paragraph::new(lines).block(block("Keys (any key closes)".to_string(), true, theme)),
        r,
    );
}

#[cfg(test)]
mod tests {
    use super::super::model::tests::{code, drive, key, loaded};
    use super::super::model::{Event, Reply};
    use super::*;
    use ratatui::Terminal;
    use ratatui::backend::TestBackend;
    use ratatui::crossterm::event::KeyCode;

    fn render(m: &Model, theme: Theme) -> (String, ratatui::buffer::Buffer) {
        let mut t = Terminal::new(TestBackend::new(m.size.0, m.size.1)).unwrap();
        t.draw(|f| draw(f, m, theme)).unwrap();
        let buf = t.backend().buffer().clone();
        let mut text = String::new();
        for y in 0..buf.area.height {
            for x in 0..buf.area.width {
                text.push_str(buf[(x, y)].symbol());
            }
            text.push('\n');
        }
        (text, buf)
    }

    fn paths(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("src/f{i}.rs")).collect()
    }

    const COLOR: Theme = Theme { color: true };

    #[test]
    fn wide_screen_shows_timeline_files_and_diff() {
        let m = loaded(30, &paths(3), (140, 30));
        let (text, _) = render(&m, COLOR);
        assert!(text.contains("checkpointfs ui /mnt"), "{text}");
        assert!(
            text.contains("c29  12-07 10:38:22  sess2abc  A1 M2 D0  +10 -3  by bash, sed"),
            "{text}"
        );
        assert!(text.contains("Timeline 1/30"), "{text}");
        assert!(text.contains("Files of c29 3"), "{text}");
        assert!(text.contains("M src/f0.rs  by sed"), "{text}");
        assert!(text.contains("Diff src/f0.rs"), "{text}");
        assert!(text.contains("+new"), "{text}");
        assert!(text.contains("-old"), "{text}");
    }

    #[test]
    fn a_40_by_10_terminal_shows_the_focused_pane() {
        let all = paths(3);
        let mut m = loaded(30, &all, (40, 10));
        let (text, _) = render(&m, COLOR);
        assert!(text.contains("Timeline 1/30"), "{text}");
        assert!(text.contains("c29  12-07 10:38:22"), "{text}");
        assert!(!text.contains("Files of"), "{text}");
        drive(&mut m, code(KeyCode::Enter), 30, &all);
        let (text, _) = render(&m, COLOR);
        assert!(text.contains("Files of c29"), "{text}");
        drive(&mut m, code(KeyCode::Enter), 30, &all);
        let (text, _) = render(&m, COLOR);
        assert!(text.contains("+new"), "{text}");
        // Resized back: all three.
        drive(&mut m, Event::Resize(140, 30), 30, &all);
        let (text, _) = render(&m, COLOR);
        assert!(
            text.contains("Timeline") && text.contains("Files of"),
            "{text}"
        );
    }

    #[test]
    fn no_color_draws_no_colour() {
        let m = loaded(30, &paths(3), (140, 30));
        let (_, buf) = render(&m, Theme { color: false });
        for cell in buf.content() {
            assert_eq!(cell.fg, Color::Reset, "{cell:?}");
            assert_eq!(cell.bg, Color::Reset, "{cell:?}");
        }
        let (_, buf) = render(&m, COLOR);
        assert!(buf.content().iter().any(|c| c.fg == Color::Green));
    }

    #[test]
    fn names_and_content_with_control_characters_are_quoted() {
        let all = vec!["bad\nname\x1b[2J".to_string()];
        let m = loaded(2, &all, (140, 30));
        let (text, _) = render(&m, COLOR);
        assert!(text.contains(r#""bad\nname\033[2J""#), "{text}");
        assert_eq!(printable("a\x1bb\tc"), "a\\x1bb    c");
    }

    #[test]
    fn help_dialog_and_gone_are_drawn() {
        let all = paths(1);
        let mut m = loaded(3, &all, (100, 30));
        m.update(key('?'));
        let (text, _) = render(&m, COLOR);
        assert!(text.contains("restore the selected file"), "{text}");
        m.update(key('x'));
        m.update(key('r'));
        let (text, _) = render(&m, COLOR);
        assert!(
            text.contains("checkpointfs rewind /mnt c2 -- src/f0.rs"),
            "{text}"
        );
        assert!(text.contains("checking what it would change"), "{text}");
        let action = m.dialog.as_ref().unwrap().action.clone();
        m.update(Event::Reply(Box::new(Reply::Preview {
            action,
            text: "would rewrite  src/f0.rs\n".into(),
            undo_id: "c2:before-rewind".into(),
        })));
        let (text, _) = render(&m, COLOR);
        assert!(text.contains("would rewrite  src/f0.rs"), "{text}");
        assert!(text.contains("undo with:"), "{text}");
        assert!(
            text.contains("  checkpointfs rewind /mnt c2:before-rewind"),
            "{text}"
        );
        m.update(Event::Reply(Box::new(Reply::Gone(
            "cannot reach the checkpointfs daemon".into(),
        ))));
        let (text, _) = render(&m, COLOR);
        assert!(text.contains("The mount went away"), "{text}");
        assert!(
            text.contains("cannot reach the checkpointfs daemon"),
            "{text}"
        );
    }

    #[test]
    fn a_binary_file_is_noted() {
        use crate::history::browse::FileDiffAnswer;
        use crate::history::changes::ChangeKind;
        use crate::history::logdiff::{ContentChange, FileDiff};
        let answer = FileDiffAnswer {
            schema: String::new(),
            from: "c1".into(),
            to: None,
            diff: Some(FileDiff {
                path: "img.png".into(),
                change: ChangeKind::Modified,
                before: None,
                after: None,
                content: ContentChange::Binary,
                insertions: 0,
                deletions: 0,
                patch: None,
                bytes_changed: None,
            }),
        };
        let lines = super::super::model::diff_lines(&answer);
        assert!(
            lines.iter().any(|l| l.starts_with("binary file:")),
            "{lines:?}"
        );
    }

    /// 10,000 checkpoints and 100,000 changed paths in the selected one, the pages fed as
    /// the source sends them: every keypress (update and a full redraw into a TestBackend)
    /// within 50 ms at the 95th percentile. What it measures is the UI's own cost; the
    /// pages' queries run on the worker thread and are not part of a keypress.
    #[test]
    fn each_keypress_redraws_within_50_ms_with_10k_checkpoints_and_100k_paths() {
        let all: Vec<String> = (0..100_000)
            .map(|i| format!("src/m{}/f{i}.rs", i % 97))
            .collect();
        let mut m = loaded(10_000, &all, (160, 50));
        let mut t = Terminal::new(TestBackend::new(160, 50)).unwrap();
        let keys = [
            code(KeyCode::Down),
            code(KeyCode::PageDown),
            code(KeyCode::Enter),
            code(KeyCode::End),
            code(KeyCode::PageUp),
            key('/'),
            key('9'),
            key('9'),
            code(KeyCode::Backspace),
            code(KeyCode::Esc),
            code(KeyCode::Tab),
            key('j'),
            code(KeyCode::Tab),
            key('G'),
            key('n'),
        ];
        let mut times = Vec::new();
        for round in 0..20 {
            for k in &keys {
                let start = std::time::Instant::now();
                drive(&mut m, k.clone(), 10_000, &all);
                t.draw(|f| draw(f, &m, COLOR)).unwrap();
                times.push(start.elapsed());
            }
            if round == 0 {
                assert!(m.timeline.len() == 10_000 && m.files.len() >= 1);
            }
        }
        times.sort();
        let p95 = times[times.len() * 95 / 100];
        let p50 = times[times.len() / 2];
        println!(
            "ui keypress with 10k checkpoints, 100k paths: p50 {p50:?}, p95 {p95:?} \
             ({} keys, the page answers included)",
            times.len()
        );
        assert!(p95 <= std::time::Duration::from_millis(50), "p95 {p95:?}");
    }
}
