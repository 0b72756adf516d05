//! Agent state: files an agent keeps *about itself* inside the project, which a rewind of
//! the project must leave alone.
//!
//! Claude Code writes `.claude/settings.local.json` when the user answers "don't ask
//! again": rewinding it would silently revoke the permissions the user granted. Aider keeps
//! its chat and input history and a tags cache next to the code: rewinding them would erase
//! the conversation that led to the state being rewound. Such paths stay tracked (they show
//! in `at/<id>/`, `log` and `diff`), but a rewind skips them unless asked to rewind them
//! (`--rewind-agent-state`, or naming them as the rewind's paths).
//!
//! A rule is a run of path components matched at any depth, so an agent started in a
//! subdirectory (`sub/.claude/settings.local.json`) is covered too; a rule naming a
//! directory covers everything below it.

/// The default rules, one per agent-state path (documented in docs/usage.md).
pub const DEFAULT_RULES: &[&str] = &[
    // Claude Code: permissions granted with "don't ask again".
    ".claude/settings.local.json",
    // Aider: chat, input and LLM history, and the repository map cache.
    ".aider.chat.history.md",
    ".aider.input.history",
    ".aider.llm.history",
    ".aider.tags.cache.v3",
    ".aider.tags.cache.v4",
];

/// The rule that makes `path` (relative to the mount root) agent state, if any.
pub fn matching_rule(path: &str) -> Option<&'static str> {
    let components: Vec<&str> = path.split('/').collect();
    DEFAULT_RULES.iter().copied().find(|rule| {
        let wanted: Vec<&str> = rule.split('/').collect();
        components.windows(wanted.len()).any(|w| w == wanted)
    })
}

/// Whether `path` is `dir` or below it (`dir` empty: the root, so everything).
pub fn is_at_or_below(path: &str, dir: &str) -> bool {
    dir.is_empty()
        || path == dir
        || (path.starts_with(dir) && path.as_bytes().get(dir.len()) == Some(&b'/'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_match_at_any_depth_and_below_directories() {
        assert_eq!(
            matching_rule(".claude/settings.local.json"),
            Some(".claude/settings.local.json")
        );
        assert!(matching_rule("sub/pkg/.claude/settings.local.json").is_some());
        assert!(matching_rule(".aider.tags.cache.v4/cache.db").is_some());
        assert!(matching_rule("a/.aider.chat.history.md").is_some());
        // Not agent state: the project's shared settings, look-alikes, partial names.
        assert_eq!(matching_rule(".claude/settings.json"), None);
        assert_eq!(matching_rule(".claude"), None);
        assert_eq!(matching_rule("x.claude/settings.local.json"), None);
        assert_eq!(matching_rule(".claude/settings.local.json.bak"), None);
        assert_eq!(matching_rule("src/main.rs"), None);
    }

    #[test]
    fn below_means_component_wise() {
        assert!(is_at_or_below(".claude/x", ".claude"));
        assert!(is_at_or_below(".claude", ".claude"));
        assert!(is_at_or_below("anything", ""));
        assert!(!is_at_or_below(".claudex/y", ".claude"));
    }
}
