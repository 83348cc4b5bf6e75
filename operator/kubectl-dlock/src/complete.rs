//! Shell completion for `kubectl dlock …`. kubectl completes a plugin's words by running the
//! executable `kubectl_complete-NAME` on PATH with the words after `kubectl NAME` (the last one
//! being completed, possibly empty) and reading its answer in the format of kubectl's own
//! `__complete`: one candidate per line, then `:DIRECTIVE`. `kubectl_complete-dlock` (next to the
//! crate) runs `kubectl-dlock __complete WORDS…`, answered here from the clap definition, so the
//! candidates follow the commands and flags as they are.
//!
//! `kubectl-dlock completion bash|zsh|fish` is the script for the binary typed as one word.

use clap::CommandFactory;

use crate::cli::Cli;

/// The hidden first argument that asks for candidates instead of running a command.
pub const COMPLETE: &str = "__complete";
/// kubectl's (cobra's) `ShellCompDirectiveNoFileComp`: no file names either.
pub const NO_FILE_COMPLETION: u32 = 4;

/// The answer for `words` (the words after `kubectl dlock`, the last one being completed): the
/// lines kubectl reads.
pub fn answer(words: &[String]) -> String {
    let mut out = String::new();
    for c in candidates(words) {
        out.push_str(&c);
        out.push('\n');
    }
    out.push_str(&format!(":{NO_FILE_COMPLETION}\n"));
    out
}

/// The subcommands, flags or flag values that can follow `words[..last]` and start with the last
/// word. Object names are not completed (that would need a cluster call on every key press).
pub fn candidates(words: &[String]) -> Vec<String> {
    let mut root = Cli::command();
    // Built, so that every argument knows how many values it takes.
    root.build();
    let (partial, done) = match words.split_last() {
        Some((last, done)) => (last.as_str(), done),
        None => ("", &[][..]),
    };
    let mut current = &root;
    // The flag whose value is the next word, when the previous word was one.
    let mut value_of: Option<&clap::Arg> = None;
    // Positional words given to `current` so far (the LockService, the key, a shell).
    let mut positionals = 0;
    for w in done {
        if value_of.take().is_some() {
            continue;
        }
        if let Some(flag) = w.strip_prefix("--") {
            if !flag.contains('=') {
                value_of =
                    find_arg(&root, current, |a| a.get_long() == Some(flag)).filter(|a| takes_value(a));
            }
        } else if let Some(short) = w.strip_prefix('-').filter(|s| s.chars().count() == 1) {
            let c = short.chars().next();
            value_of = find_arg(&root, current, |a| a.get_short() == c).filter(|a| takes_value(a));
        } else if let Some(sub) = current.find_subcommand(w.as_str()) {
            current = sub;
            positionals = 0;
        } else {
            positionals += 1;
        }
    }
    let values = |arg: &clap::Arg| -> Vec<String> {
        arg.get_possible_values()
            .iter()
            .filter(|v| !v.is_hide_set())
            .map(|v| v.get_name().to_owned())
            .collect()
    };
    let mut out: Vec<String> = if let Some(arg) = value_of {
        values(arg)
    } else if partial.starts_with('-') {
        let mut flags: Vec<String> = current
            .get_arguments()
            .chain(root.get_arguments().filter(|a| a.is_global_set()))
            .filter(|a| !a.is_hide_set())
            .filter_map(|a| a.get_long().map(|l| format!("--{l}")))
            .collect();
        flags.push("--help".to_owned());
        flags
    } else if current.has_subcommands() {
        current
            .get_subcommands()
            .filter(|s| !s.is_hide_set() && s.get_name() != "help")
            .map(|s| s.get_name().to_owned())
            .collect()
    } else {
        // The next positional's fixed values, if it has any (a shell); names of objects are not
        // known without the cluster.
        current
            .get_positionals()
            .nth(positionals)
            .map(values)
            .unwrap_or_default()
    };
    out.retain(|c| c.starts_with(partial));
    out.sort();
    out.dedup();
    out
}

fn takes_value(arg: &clap::Arg) -> bool {
    arg.get_num_args().is_some_and(|n| n.takes_values())
}

/// A flag of `current`, or a global one of `root`.
fn find_arg<'a>(
    root: &'a clap::Command,
    current: &'a clap::Command,
    matches: impl Fn(&clap::Arg) -> bool,
) -> Option<&'a clap::Arg> {
    current
        .get_arguments()
        .find(|a| matches(a))
        .or_else(|| root.get_arguments().find(|a| a.is_global_set() && matches(a)))
}

/// The completion script for `shell`, for the binary `kubectl-dlock`.
pub fn script(shell: clap_complete::Shell) -> String {
    // Named as the binary, not as kubectl shows it (`kubectl dlock`): the shell completes one word.
    let mut cmd = Cli::command().bin_name("kubectl-dlock");
    let mut out = Vec::new();
    clap_complete::generate(shell, &mut cmd, "kubectl-dlock", &mut out);
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn complete(words: &[&str]) -> Vec<String> {
        candidates(&words.iter().map(|w| w.to_string()).collect::<Vec<_>>())
    }

    #[test]
    fn the_subcommands_complete_first() {
        assert_eq!(
            complete(&[""]),
            ["completion", "locks", "restore", "revoke", "status"]
        );
        assert_eq!(complete(&["re"]), ["restore", "revoke"]);
        assert_eq!(complete(&[]), complete(&[""]));
        // The global flags before the subcommand, and their values, are skipped over.
        assert_eq!(complete(&["-n", "pay", "--context", "prod", "lo"]), ["locks"]);
        assert!(!complete(&[""]).iter().any(|c| c.contains(COMPLETE)));
    }

    #[test]
    fn flags_and_their_values_complete_per_subcommand() {
        let locks = complete(&["locks", "payments-locks", "--"]);
        for want in [
            "--prefix",
            "--lock-server-url",
            "--output",
            "--namespace",
            "--context",
            "--help",
        ] {
            assert!(locks.contains(&want.to_owned()), "{want} in {locks:?}");
        }
        assert!(!locks.contains(&"--reason".to_owned()), "{locks:?}");
        let revoke = complete(&["revoke", "l", "k", "--re"]);
        assert_eq!(revoke, ["--reason", "--requested-by"]);
        assert_eq!(complete(&["status", "x", "-o", ""]), ["json", "table"]);
        assert_eq!(complete(&["locks", "x", "--output", "j"]), ["json"]);
        assert_eq!(
            complete(&["completion", ""]),
            ["bash", "elvish", "fish", "powershell", "zsh"]
        );
        // A flag's value is not taken for a subcommand.
        assert_eq!(complete(&["-n", "status", ""]), complete(&[""]));
    }

    #[test]
    fn the_answer_is_in_kubectls_format() {
        let text = answer(&["st".to_owned()]);
        assert_eq!(text, "status\n:4\n");
        assert_eq!(answer(&["nothing".to_owned()]), ":4\n");
    }

    #[test]
    fn the_bash_script_completes_every_subcommand() {
        let bash = script(clap_complete::Shell::Bash);
        // Registered for the command typed as one word (clap names the function `_kubectl__dlock`).
        assert!(
            bash.contains("complete -F _kubectl__dlock") && bash.contains(" kubectl-dlock\n"),
            "{bash}"
        );
        for sub in ["revoke", "restore", "status", "locks", "completion"] {
            assert!(bash.contains(sub), "{sub}");
        }
        assert!(bash.contains("--lock-server-url") && bash.contains("--output"));
        for shell in [clap_complete::Shell::Zsh, clap_complete::Shell::Fish] {
            assert!(script(shell).contains("lock-server-url"), "{shell}");
        }
    }
}
