//! `--config FILE`: a start's flags read from a TOML file, merged under the command line.
//!
//! A start path: runs first, on the raw command line, and hands `main` the parsed
//! [`Args`]; imports only `flags`.
//!
//! The file's keys are the long flags of the main start (`polis-node --root ...`), named
//! as the flags without their dashes. Each key becomes its flag (`--key=value`; a switch
//! set true becomes `--key`), placed right before the real command line's own flags, and
//! clap parses the two as one command line: every value goes through the flag's own
//! parser and checks (requires, conflicts), so a value in the file means exactly what the
//! flag means. With `recover` or `restore` the flags go after the subcommand's name, and
//! only the keys that subcommand has as flags are used.
//!
//! Invariants:
//! - The command line wins: clap keeps the last occurrence of a flag
//!   (`args_override_self`, see `flags`), and the file's flags come first. A flag's
//!   environment variable also wins over the file: the file's key is left out while it
//!   is set.
//! - Every key is checked against clap's own list of long flags, and its TOML type
//!   against what the flag takes (switch: boolean; number: integer; else string).
//! - Every refusal the file causes names the file, the line and the key; refusals of the
//!   command line alone stay clap's own (usage, exit status 2).
//! - Without `--config` the command line is parsed exactly as `Args::parse` would.

use std::any::TypeId;
use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt as _;
use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result, anyhow, bail};
use clap::error::{ContextKind, ContextValue, ErrorKind};
use clap::{Arg, ArgAction, CommandFactory as _, Parser as _};
use toml::de::{DeTable, DeValue};

use crate::config::flags::Args;

/// The flag naming the file: not a key of the file (a file names no other file).
const CONFIG_FLAG: &str = "config";

/// Parses `raw` (the binary's name first, as `std::env::args_os`) with the settings of
/// the `--config` file it names, if any. `env_var` reads the environment (a parameter so
/// that tests need not change the process's own). A clap error that the file did not
/// cause is returned as the [`clap::Error`] itself, for `main` to exit with.
pub(crate) fn parse(
    raw: Vec<OsString>,
    env_var: &dyn Fn(&OsStr) -> Option<OsString>,
) -> Result<Args> {
    let Some(path) = config_path(&raw) else {
        return Ok(Args::try_parse_from(raw)?);
    };
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("reading the node configuration from {}", path.display()))?;
    let entries = entries(&path, &text)?;
    let command = Args::command();
    // A subcommand is the first argument or none (`args_conflicts_with_subcommands`).
    let subcommand = raw
        .get(1)
        .and_then(|first| first.to_str())
        .and_then(|name| command.find_subcommand(name));
    let (insert_at, target) = match subcommand {
        Some(sub) => (2, sub),
        None => (1, &command),
    };
    if !target
        .get_arguments()
        .any(|a| a.get_long() == Some(CONFIG_FLAG))
    {
        // `set-curators --config`: clap refuses the flag, as it would without this module.
        return Ok(Args::try_parse_from(raw)?);
    }
    let mut from_file = Vec::new();
    let mut flags = Vec::new();
    for entry in &entries {
        let Some(flag) = entry.flag(&path, &command)? else {
            continue; // a switch set false: as if absent
        };
        let Some(target_arg) = target
            .get_arguments()
            .find(|a| a.get_long() == Some(entry.key.as_str()))
        else {
            continue; // a node setting this subcommand does not take
        };
        if target_arg
            .get_env()
            .is_some_and(|name| env_var(name).is_some())
        {
            continue;
        }
        flags.push(flag);
        from_file.push(entry);
    }
    let mut merged = raw[..insert_at].to_vec();
    merged.extend(flags);
    merged.extend_from_slice(&raw[insert_at..]);
    Args::try_parse_from(merged).map_err(|e| blame(e, &path, &from_file))
}

/// The last `--config FILE` or `--config=FILE` before a `--`, as clap reads it: clap
/// keeps the last occurrence, and takes no value starting with `-` after a separate
/// `--config` (it refuses that command line itself then). A `--config` token is never
/// another flag's value, for the same reason.
fn config_path(raw: &[OsString]) -> Option<PathBuf> {
    let long = format!("--{CONFIG_FLAG}");
    let long = long.as_bytes();
    let mut found = None;
    let mut tokens = raw.iter().skip(1).map(|t| t.as_bytes());
    while let Some(token) = tokens.next() {
        if token == b"--" {
            break;
        }
        if token == long {
            let value = tokens.next().filter(|v| !v.starts_with(b"-") || *v == b"-");
            found = value.map(|v| PathBuf::from(OsStr::from_bytes(v))).or(found);
        } else if let Some(value) = token.strip_prefix(long).and_then(|t| t.strip_prefix(b"=")) {
            found = Some(PathBuf::from(OsStr::from_bytes(value)));
        }
    }
    found
}

/// One `key = value` of the file.
#[derive(Debug)]
struct Entry {
    key: String,
    /// 1-based line of the key.
    line: usize,
    value: Value,
}

/// A TOML value, as far as flags go.
#[derive(Debug)]
enum Value {
    Boolean(bool),
    Integer(i128),
    String(String),
    /// Anything no flag takes: its TOML type, for the refusal.
    Other(&'static str),
}

impl Value {
    fn from_toml(value: &DeValue<'_>) -> Value {
        match value {
            DeValue::Boolean(b) => Value::Boolean(*b),
            DeValue::String(s) => Value::String(s.to_string()),
            // TOML integers are 64-bit, so this always fits; no panic if a parser allows more.
            DeValue::Integer(n) => i128::from_str_radix(n.as_str(), n.radix())
                .map_or(Value::Other("an integer out of range"), Value::Integer),
            DeValue::Float(_) => Value::Other("a float"),
            DeValue::Datetime(_) => Value::Other("a date-time"),
            DeValue::Array(_) => Value::Other("an array"),
            DeValue::Table(_) => Value::Other("a table"),
        }
    }

    /// The value as written after `--key=`; `None` for a switch.
    fn as_flag_value(&self) -> Option<String> {
        match self {
            Value::Integer(n) => Some(n.to_string()),
            Value::String(s) => Some(s.clone()),
            Value::Boolean(_) | Value::Other(_) => None,
        }
    }

    fn type_name(&self) -> &'static str {
        match self {
            Value::Boolean(_) => "a boolean",
            Value::Integer(_) => "an integer",
            Value::String(_) => "a string",
            Value::Other(name) => name,
        }
    }
}

/// What a flag takes, hence the TOML type of its key.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Takes {
    /// A switch: true or false.
    Boolean,
    Integer,
    String,
}

impl Takes {
    fn describe(self) -> &'static str {
        match self {
            Takes::Boolean => "a boolean (true or false)",
            Takes::Integer => "an integer",
            Takes::String => "a string",
        }
    }
}

/// What the key of `arg` takes, or `None` when `arg` is no key of the file: not a long
/// flag, `--config`, or a flag that is not a plain switch or single value (help, version;
/// a flag repeated for several values would need its own rule against the command line).
fn takes(arg: &Arg) -> Option<Takes> {
    if arg.get_long().is_none_or(|long| long == CONFIG_FLAG) {
        return None;
    }
    match arg.get_action() {
        ArgAction::SetTrue => Some(Takes::Boolean),
        ArgAction::Set if arg.get_num_args().is_none_or(|n| n.max_values() <= 1) => {
            let parsed = arg.get_value_parser().type_id();
            let integers = [
                TypeId::of::<u8>(),
                TypeId::of::<u16>(),
                TypeId::of::<u32>(),
                TypeId::of::<u64>(),
                TypeId::of::<usize>(),
                TypeId::of::<i8>(),
                TypeId::of::<i16>(),
                TypeId::of::<i32>(),
                TypeId::of::<i64>(),
                TypeId::of::<isize>(),
            ];
            Some(if integers.iter().any(|t| parsed == *t) {
                Takes::Integer
            } else {
                Takes::String
            })
        }
        _ => None,
    }
}

/// The keys a file may hold (the main start's long flags, hidden ones included), in the
/// order of `polis-node --help`.
fn keys(command: &clap::Command) -> impl Iterator<Item = (&Arg, Takes)> {
    command
        .get_arguments()
        .filter_map(|arg| takes(arg).map(|t| (arg, t)))
}

impl Entry {
    /// The flag this entry stands for, checked against the main start's flags (`command`);
    /// `None` for a switch set false.
    fn flag(&self, path: &Path, command: &clap::Command) -> Result<Option<OsString>> {
        let at = format!("{}:{}", path.display(), self.line);
        let Some((_, takes)) = keys(command).find(|(a, _)| a.get_long() == Some(&self.key)) else {
            let known: Vec<&str> = keys(command)
                .filter(|(a, _)| !a.is_hide_set())
                .filter_map(|(a, _)| a.get_long())
                .collect();
            bail!(
                "{at}: unknown key {:?}; the keys are: {}",
                self.key,
                known.join(", ")
            );
        };
        let key = &self.key;
        Ok(match (takes, &self.value) {
            (Takes::Boolean, Value::Boolean(true)) => Some(format!("--{key}").into()),
            (Takes::Boolean, Value::Boolean(false)) => None,
            (Takes::Integer, Value::Integer(_)) | (Takes::String, Value::String(_)) => {
                let value = self.value.as_flag_value().unwrap_or_default();
                Some(format!("--{key}={value}").into())
            }
            (takes, found) => bail!(
                "{at}: {key}: expected {}, found {}",
                takes.describe(),
                found.type_name()
            ),
        })
    }
}

/// The file's `key = value` lines, in file order; TOML syntax errors name their line.
fn entries(path: &Path, text: &str) -> Result<Vec<Entry>> {
    let table = DeTable::parse(text).map_err(|e| {
        let line = e.span().map_or(1, |span| line_of(text, span.start));
        anyhow!("{}:{line}: {}", path.display(), e.message())
    })?;
    let mut entries: Vec<(usize, Entry)> = table
        .get_ref()
        .iter()
        .map(|(key, value)| {
            let start = key.span().start;
            let entry = Entry {
                key: key.get_ref().to_string(),
                line: line_of(text, start),
                value: Value::from_toml(value.get_ref()),
            };
            (start, entry)
        })
        .collect();
    entries.sort_by_key(|(start, _)| *start);
    Ok(entries.into_iter().map(|(_, entry)| entry).collect())
}

/// The 1-based line holding byte `offset` of `text`.
fn line_of(text: &str, offset: usize) -> usize {
    let before = text.get(..offset).unwrap_or(text);
    before.bytes().filter(|b| *b == b'\n').count() + 1
}

/// `error` from parsing the merged command line, as a refusal naming the file's line when
/// it concerns a flag the file gave; a missing flag is one the file could have given.
fn blame(error: clap::Error, path: &Path, from_file: &[&Entry]) -> anyhow::Error {
    if matches!(
        error.kind(),
        ErrorKind::DisplayHelp | ErrorKind::DisplayVersion
    ) {
        return error.into();
    }
    let named = flags_named(&error);
    // A bad value is the file's only when it is the file's value: the same flag on the
    // command line comes later, so clap met the file's first.
    let bad_value = match error.get(ContextKind::InvalidValue) {
        Some(ContextValue::String(value)) => Some(value.as_str()),
        _ => None,
    };
    let caused = |entry: &&Entry| {
        named.contains(&entry.key)
            && bad_value.is_none_or(|bad| entry.value.as_flag_value().as_deref() == Some(bad))
    };
    if let Some(entry) = from_file.iter().copied().find(caused) {
        return anyhow!(
            "{}:{}: {}: {}",
            path.display(),
            entry.line,
            entry.key,
            message(&error)
        );
    }
    // Missing flags the file could have given (not `restore --backup`): say so.
    let command = Args::command();
    let is_key = |flag: &String| keys(&command).any(|(a, _)| a.get_long() == Some(flag));
    if error.kind() == ErrorKind::MissingRequiredArgument && named.iter().all(is_key) {
        let missing: Vec<String> = named
            .iter()
            .map(|key| format!("no {key}: give `{key} = ...` in the file or --{key}"))
            .collect();
        return anyhow!("{}: {}", path.display(), missing.join("; "));
    }
    error.into()
}

/// The long flags a clap error is about (`--address <ADDRESS>` → `address`).
fn flags_named(error: &clap::Error) -> Vec<String> {
    let mut shown = Vec::new();
    for kind in [ContextKind::InvalidArg, ContextKind::PriorArg] {
        match error.get(kind) {
            Some(ContextValue::String(s)) => shown.push(s.as_str()),
            Some(ContextValue::Strings(all)) => shown.extend(all.iter().map(String::as_str)),
            _ => {}
        }
    }
    shown
        .into_iter()
        .filter_map(|s| s.strip_prefix("--"))
        .map(|s| s.split([' ', '=']).next().unwrap_or(s).to_string())
        .collect()
}

/// clap's message for `error` on one line, without its "error: " and its usage hints.
fn message(error: &clap::Error) -> String {
    let rendered = error.render().to_string();
    let first_paragraph = rendered.split("\n\n").next().unwrap_or(&rendered);
    let lines: Vec<&str> = first_paragraph.lines().map(str::trim).collect();
    lines.join(" ").trim_start_matches("error: ").to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::flags::Command;

    /// A configuration file in its own temporary directory.
    struct File {
        _dir: tempfile::TempDir,
        path: PathBuf,
    }

    fn file(text: &str) -> File {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("node.toml");
        std::fs::write(&path, text).unwrap();
        File { _dir: dir, path }
    }

    fn no_env(_: &OsStr) -> Option<OsString> {
        None
    }

    /// `polis-node ARGS` with `--config FILE` inserted after the first `before` of them.
    fn parse_with(file: &File, before: usize, args: &[&str]) -> Result<Args> {
        let mut raw: Vec<OsString> = vec!["polis-node".into()];
        raw.extend(args[..before].iter().map(OsString::from));
        raw.extend(["--config".into(), file.path.clone().into_os_string()]);
        raw.extend(args[before..].iter().map(OsString::from));
        parse(raw, &no_env)
    }

    fn parse_flags(args: &[&str]) -> Args {
        let raw = std::iter::once("polis-node").chain(args.iter().copied());
        parse(raw.map(OsString::from).collect(), &no_env).unwrap()
    }

    /// Everything parsed but the `--config` flag itself, for comparisons.
    fn settings(mut args: Args) -> String {
        match &mut args.command {
            None => args.common.config = None,
            Some(Command::Recover(r)) => r.common.config = None,
            Some(Command::Restore(r)) => r.common.config = None,
            Some(Command::SetCurators(_)) => {}
        }
        format!("{args:?}")
    }

    fn refusal(file: &File, args: &[&str]) -> String {
        let error = parse_with(file, 0, args).expect_err("refused");
        assert!(
            error.downcast_ref::<clap::Error>().is_none(),
            "a refusal of the file, not clap's: {error:#}"
        );
        format!("{error:#}")
    }

    /// Every key but `no-metrics` (it conflicts with `metrics-listen`), as TOML and as
    /// the equivalent flag.
    const EVERY_KEY: &[(&str, &str, &str)] = &[
        ("root", r#""/var/lib/polis""#, "--root=/var/lib/polis"),
        ("address", r#""10.1.2.3""#, "--address=10.1.2.3"),
        (
            "params",
            r#""/etc/polis/params.pb""#,
            "--params=/etc/polis/params.pb",
        ),
        ("data-device", r#""/dev/vdb""#, "--data-device=/dev/vdb"),
        ("data-device-format", "true", "--data-device-format"),
        ("log-format", r#""json""#, "--log-format=json"),
        (
            "metrics-listen",
            r#""127.0.0.1:9100""#,
            "--metrics-listen=127.0.0.1:9100",
        ),
        (
            "etcd-binary",
            r#""/opt/etcd/etcd""#,
            "--etcd-binary=/opt/etcd/etcd",
        ),
        (
            "kubernetes-binaries",
            r#""/opt/polis/kubernetes""#,
            "--kubernetes-binaries=/opt/polis/kubernetes",
        ),
        (
            "runtime-binaries",
            r#""/opt/polis/runtime""#,
            "--runtime-binaries=/opt/polis/runtime",
        ),
        (
            "kubernetes-images",
            r#""/opt/polis/images""#,
            "--kubernetes-images=/opt/polis/images",
        ),
        (
            "cni-plugins",
            r#""/opt/cni/bin""#,
            "--cni-plugins=/opt/cni/bin",
        ),
        (
            "kubernetes-certificate-lifetime-s",
            "3600",
            "--kubernetes-certificate-lifetime-s=3600",
        ),
        ("etcd-heartbeat-ms", "50", "--etcd-heartbeat-ms=50"),
        (
            "etcd-election-timeout-ms",
            "0x1f4",
            "--etcd-election-timeout-ms=500",
        ),
        ("tcp-rto-max-ms", "1_000", "--tcp-rto-max-ms=1000"),
        ("curator-lease-ttl", "5", "--curator-lease-ttl=5"),
        ("heartbeat-period-ms", "200", "--heartbeat-period-ms=200"),
        (
            "heartbeat-timeout-ms",
            "1000",
            "--heartbeat-timeout-ms=1000",
        ),
        (
            "etcd-upkeep-period-ms",
            "500",
            "--etcd-upkeep-period-ms=500",
        ),
        (
            "etcd-defrag-floor-bytes",
            "1024",
            "--etcd-defrag-floor-bytes=1024",
        ),
        (
            "etcd-history-bytes",
            "1048576",
            "--etcd-history-bytes=1048576",
        ),
        (
            "etcd-history-min-age-ms",
            "2000",
            "--etcd-history-min-age-ms=2000",
        ),
        (
            "snapshot-short-intervals",
            "true",
            "--snapshot-short-intervals",
        ),
        ("entry-rate-per-second", "0", "--entry-rate-per-second=0"),
        (
            "log-test-lines-per-second",
            "5",
            "--log-test-lines-per-second=5",
        ),
    ];

    #[test]
    fn a_full_file_parses_as_the_equivalent_flags() {
        let text: String = EVERY_KEY
            .iter()
            .map(|(key, value, _)| format!("{key} = {value}\n"))
            .collect();
        let flags: Vec<&str> = EVERY_KEY.iter().map(|(_, _, flag)| *flag).collect();
        let from_file = parse_with(&file(&text), 0, &[]).unwrap();
        assert_eq!(settings(from_file), settings(parse_flags(&flags)));

        let switch = file("root = \"/r\"\naddress = \"10.1.2.3\"\nno-metrics = true\n");
        let from_file = parse_with(&switch, 0, &[]).unwrap();
        assert!(from_file.common.no_metrics);
        let flags = ["--root=/r", "--address=10.1.2.3", "--no-metrics"];
        assert_eq!(settings(from_file), settings(parse_flags(&flags)));
    }

    #[test]
    fn every_long_flag_of_a_start_is_a_key_and_the_test_covers_them_all() {
        let command = Args::command();
        let keys: Vec<&str> = keys(&command).filter_map(|(a, _)| a.get_long()).collect();
        for arg in command.get_arguments() {
            if let Some(long) = arg.get_long().filter(|l| *l != CONFIG_FLAG) {
                assert!(keys.contains(&long), "--{long} is not a key of the file");
            }
        }
        let mut covered: Vec<&str> = EVERY_KEY.iter().map(|(key, _, _)| *key).collect();
        covered.push("no-metrics");
        covered.sort();
        let mut keys = keys;
        keys.sort();
        assert_eq!(covered, keys);
    }

    #[test]
    fn flags_override_the_file() {
        let f = file(
            "root = \"/from/file\"\naddress = \"10.0.0.1\"\nlog-format = \"json\"\n\
             etcd-heartbeat-ms = 50\nno-metrics = false\n",
        );
        let parsed = parse_with(&f, 0, &["--address", "10.0.0.2", "--etcd-heartbeat-ms=70"]);
        let parsed = parsed.unwrap();
        assert_eq!(parsed.root, Some(PathBuf::from("/from/file")));
        assert_eq!(parsed.address, Some("10.0.0.2".parse().unwrap()));
        assert!(matches!(
            parsed.common.log_format,
            crate::config::flags::LogFormat::Json
        ));
        assert_eq!(parsed.common.etcd_heartbeat_ms, 70);
        assert!(!parsed.common.no_metrics);
        assert!(
            parse_with(&f, 0, &["--no-metrics"])
                .unwrap()
                .common
                .no_metrics
        );
        // Where --config stands among the flags does not matter.
        let parsed = parse_with(&f, 2, &["--address", "10.0.0.2"]).unwrap();
        assert_eq!(parsed.address, Some("10.0.0.2".parse().unwrap()));
    }

    #[test]
    fn a_flag_given_twice_keeps_its_last_value() {
        let parsed = parse_flags(&["--root=/a", "--address=10.0.0.1", "--root=/b"]);
        assert_eq!(parsed.root, Some(PathBuf::from("/b")));
        let parsed = parse_flags(&[
            "--root=/a",
            "--address=10.0.0.1",
            "--no-metrics",
            "--no-metrics",
        ]);
        assert!(parsed.common.no_metrics);
    }

    #[test]
    fn an_unknown_key_is_refused_naming_file_line_and_key() {
        let f = file("root = \"/r\"\n\nadress = \"10.0.0.1\"\n");
        let refusal = refusal(&f, &[]);
        let expected = format!(
            "{}:3: unknown key \"adress\"; the keys are: root, address, params, data-device, \
             data-device-format, log-format, metrics-listen, no-metrics, etcd-binary, kubernetes-binaries, \
             runtime-binaries, kubernetes-images, cni-plugins, etcd-heartbeat-ms, etcd-election-timeout-ms, tcp-rto-max-ms, curator-lease-ttl",
            f.path.display()
        );
        assert_eq!(refusal, expected);
        // A table is a key like any other; `config` names no other file.
        assert!(refusal_of("[node]\nroot = \"/r\"\n").contains(":1: unknown key \"node\""));
        assert!(refusal_of("config = \"/x.toml\"\n").contains(":1: unknown key \"config\""));
    }

    fn refusal_of(text: &str) -> String {
        refusal(&file(text), &[])
    }

    #[test]
    fn a_bad_address_is_refused_naming_file_line_and_key() {
        let f = file("root = \"/r\"\naddress = \"10.0.0.300\"\n");
        let refusal = refusal(&f, &[]);
        let prefix = format!(
            "{}:2: address: invalid value '10.0.0.300'",
            f.path.display()
        );
        assert!(refusal.starts_with(&prefix), "{refusal}");
        assert!(refusal.contains("invalid IP address syntax"), "{refusal}");
        // Even when the command line overrides it: the file is wrong.
        let refusal = self::refusal(&f, &["--address=10.0.0.1"]);
        assert!(refusal.starts_with(&prefix), "{refusal}");
    }

    #[test]
    fn a_value_out_of_its_flags_range_or_choices_is_refused_with_the_flags_own_words() {
        let refusal = refusal_of("etcd-heartbeat-ms = 5\n");
        assert!(
            refusal.contains(":1: etcd-heartbeat-ms: invalid value '5'"),
            "{refusal}"
        );
        assert!(refusal.contains("5 is not in 10..=5000"), "{refusal}");
        let refusal = refusal_of("\nlog-format = \"xml\"\n");
        assert!(
            refusal.contains(":2: log-format: invalid value 'xml'"),
            "{refusal}"
        );
        assert!(
            refusal.contains("[possible values: text, json]"),
            "{refusal}"
        );
        let refusal = refusal_of("root = \"\"\n");
        assert!(
            refusal.contains(":1: root: a value is required"),
            "{refusal}"
        );
    }

    #[test]
    fn a_value_of_the_wrong_type_is_refused() {
        let f = file("root = \"/r\"\naddress = \"10.0.0.1\"\nno-metrics = \"yes\"\n");
        assert_eq!(
            refusal(&f, &[]),
            format!(
                "{}:3: no-metrics: expected a boolean (true or false), found a string",
                f.path.display()
            )
        );
        for (text, expected) in [
            (
                "etcd-heartbeat-ms = \"100\"",
                "expected an integer, found a string",
            ),
            (
                "etcd-heartbeat-ms = 1.5",
                "expected an integer, found a float",
            ),
            ("root = 5", "expected a string, found an integer"),
            ("address = true", "expected a string, found a boolean"),
            (
                "root = [\"/a\", \"/b\"]",
                "expected a string, found an array",
            ),
            (
                "params = 1979-05-27",
                "expected a string, found a date-time",
            ),
            (
                "data-device = { path = \"/dev/vdb\" }",
                "expected a string, found a table",
            ),
        ] {
            let refusal = refusal_of(text);
            assert!(
                refusal.ends_with(&format!(
                    ":1: {}: {expected}",
                    text.split(' ').next().unwrap()
                )),
                "{text}: {refusal}"
            );
        }
    }

    #[test]
    fn toml_syntax_errors_name_their_line() {
        let refusal = refusal_of("root = \"/r\"\naddress = \n");
        assert!(refusal.contains(":2: "), "{refusal}");
        let refusal = refusal_of("root = \"/r\"\n\nroot = \"/s\"\n");
        assert!(refusal.contains(":3: duplicate key"), "{refusal}");
    }

    #[test]
    fn an_empty_file_and_flags_start_as_the_flags_alone() {
        let flags = ["--root=/r", "--address=10.0.0.1", "--etcd-heartbeat-ms=20"];
        let parsed = parse_with(&file(""), 0, &flags).unwrap();
        assert_eq!(parsed.common.config, Some(file_path_of(&parsed)));
        assert_eq!(settings(parsed), settings(parse_flags(&flags)));
    }

    fn file_path_of(args: &Args) -> PathBuf {
        args.common.config.clone().expect("--config parsed")
    }

    #[test]
    fn a_missing_file_is_refused_naming_its_path() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("absent.toml");
        let raw = ["polis-node", "--config", path.to_str().unwrap()];
        let error = parse(raw.map(OsString::from).to_vec(), &no_env).unwrap_err();
        let message = format!("{error:#}");
        let expected = format!("reading the node configuration from {}: ", path.display());
        assert!(message.starts_with(&expected), "{message}");
        // A directory is no file either.
        let raw = ["polis-node", "--config", dir.path().to_str().unwrap()];
        let error = parse(raw.map(OsString::from).to_vec(), &no_env).unwrap_err();
        assert!(format!("{error:#}").contains(&dir.path().display().to_string()));
    }

    #[test]
    fn root_and_address_are_still_required() {
        let f = file("log-format = \"json\"\n");
        let refusal = refusal(&f, &["--root=/r"]);
        assert_eq!(
            refusal,
            format!(
                "{}: no address: give `address = ...` in the file or --address",
                f.path.display()
            )
        );
        let both = format!(
            "{}: no root: give `root = ...` in the file or --root; \
             no address: give `address = ...` in the file or --address",
            f.path.display()
        );
        assert_eq!(self::refusal(&f, &[]), both);
        // A flag of the subcommand alone stays clap's to ask for.
        let error = parse_with(&f, 1, &["restore", "--root=/r", "--address=10.0.0.1"]);
        let error = error
            .unwrap_err()
            .downcast::<clap::Error>()
            .expect("clap's");
        assert_eq!(error.kind(), ErrorKind::MissingRequiredArgument);
        // Without a file: clap's own refusal, as before.
        let raw = ["polis-node", "--root=/r"].map(OsString::from).to_vec();
        let error = parse(raw, &no_env).unwrap_err();
        let error = error.downcast::<clap::Error>().expect("clap's refusal");
        assert_eq!(error.kind(), ErrorKind::MissingRequiredArgument);
    }

    #[test]
    fn a_conflict_with_the_command_line_names_the_files_line() {
        let f = file("root = \"/r\"\naddress = \"10.0.0.1\"\nno-metrics = true\n");
        let refusal = refusal(&f, &["--metrics-listen=127.0.0.1:9100"]);
        assert!(
            refusal.starts_with(&format!("{}:3: no-metrics: ", f.path.display())),
            "{refusal}"
        );
        assert!(refusal.contains("cannot be used with"), "{refusal}");
    }

    #[test]
    fn command_line_errors_stay_clap_errors() {
        let f = file("root = \"/r\"\naddress = \"10.0.0.1\"\netcd-heartbeat-ms = 100\n");
        for (args, kind) in [
            (&["--adress=10.0.0.1"][..], ErrorKind::UnknownArgument),
            (&["--address=nowhere"][..], ErrorKind::ValueValidation),
            (&["--help"][..], ErrorKind::DisplayHelp),
            (
                &["--etcd-heartbeat-ms", "5"][..],
                ErrorKind::ValueValidation,
            ),
        ] {
            let error = parse_with(&f, 0, args).unwrap_err();
            let error = error.downcast::<clap::Error>().expect("clap's refusal");
            assert_eq!(error.kind(), kind, "{args:?}");
        }
    }

    #[test]
    fn an_environment_variable_wins_over_the_file() {
        let f = file("root = \"/r\"\naddress = \"10.0.0.1\"\netcd-binary = \"/from/file/etcd\"\n");
        let raw: Vec<OsString> = ["polis-node", "--config", f.path.to_str().unwrap()]
            .map(OsString::from)
            .to_vec();
        let etcd_binary_set =
            |name: &OsStr| (name == "POLIS_ETCD_BINARY").then(|| "/env/etcd".into());
        let parsed = parse(raw.clone(), &etcd_binary_set).unwrap();
        assert_ne!(parsed.common.etcd_binary, PathBuf::from("/from/file/etcd"));
        let parsed = parse(raw, &no_env).unwrap();
        assert_eq!(parsed.common.etcd_binary, PathBuf::from("/from/file/etcd"));
    }

    #[test]
    fn recover_and_restore_take_the_keys_they_have() {
        let f = file(
            "root = \"/r\"\naddress = \"10.0.0.1\"\nparams = \"/p.pb\"\n\
             data-device = \"/dev/vdb\"\ndata-device-format = true\nlog-format = \"json\"\n",
        );
        let recover = parse_with(&f, 1, &["recover", "--force"]).unwrap();
        let Some(Command::Recover(r)) = recover.command else {
            panic!("recover expected");
        };
        assert_eq!(r.root, PathBuf::from("/r"));
        assert_eq!(r.address, Some("10.0.0.1".parse().unwrap()));
        assert_eq!(r.data_device, Some(PathBuf::from("/dev/vdb")));
        assert!(r.force);
        assert!(matches!(
            r.common.log_format,
            crate::config::flags::LogFormat::Json
        ));

        let restore = parse_with(&f, 1, &["restore", "--backup=/b", "--root=/new"]).unwrap();
        let Some(Command::Restore(r)) = restore.command else {
            panic!("restore expected");
        };
        assert_eq!(r.root, PathBuf::from("/new"));
        assert_eq!(r.address, "10.0.0.1".parse::<std::net::IpAddr>().unwrap());
        assert!(r.data_device_format);
        assert_eq!(r.backup, PathBuf::from("/b"));
    }

    #[test]
    fn the_example_file_shows_every_key_with_a_valid_value_its_default_if_any() {
        let example = include_str!("../../node.toml.example");
        let command = Args::command();
        let mut shown = Vec::new();
        for line in example.lines().filter_map(|l| l.strip_prefix('#')) {
            let Some((key, value)) = line.split_once(" = ") else {
                continue; // an explanation
            };
            let text = format!("{key} = {value}\n");
            // The file's value is parsed even where the command line's wins.
            let parsed = parse_with(&file(&text), 0, &["--root=/r", "--address=10.0.0.1"]);
            assert!(parsed.is_ok(), "{line}: {:#}", parsed.unwrap_err());
            let (arg, _) = keys(&command)
                .find(|(a, _)| a.get_long() == Some(key))
                .expect("a key");
            if let Some(default) = arg.get_default_values().first() {
                let entry = &entries(Path::new("example"), &text).unwrap()[0];
                let written = entry
                    .value
                    .as_flag_value()
                    .unwrap_or_else(|| value.to_string());
                assert_eq!(Some(written.as_str()), default.to_str(), "{line}");
            }
            shown.push(key);
        }
        let all: Vec<&str> = keys(&command).filter_map(|(a, _)| a.get_long()).collect();
        assert_eq!(shown, all, "the example shows every key, in --help order");
    }

    #[test]
    fn set_curators_takes_no_config_flag() {
        let f = file("root = \"/r\"\n");
        let error = parse_with(&f, 1, &["set-curators", "10.0.0.1"]).unwrap_err();
        let error = error.downcast::<clap::Error>().expect("clap's refusal");
        assert_eq!(error.kind(), ErrorKind::UnknownArgument);
    }

    #[test]
    fn the_config_flag_is_found_as_clap_finds_it() {
        let raw = |args: &[&str]| -> Vec<OsString> {
            std::iter::once("polis-node")
                .chain(args.iter().copied())
                .map(OsString::from)
                .collect()
        };
        assert_eq!(config_path(&raw(&["--config", "/a"])), Some("/a".into()));
        assert_eq!(
            config_path(&raw(&["--root=/r", "--config=/a"])),
            Some("/a".into())
        );
        assert_eq!(
            config_path(&raw(&["--config=/a", "--config", "/b"])),
            Some("/b".into())
        );
        assert_eq!(config_path(&raw(&["--", "--config", "/a"])), None);
        assert_eq!(config_path(&raw(&["--configs=/a"])), None);
        assert_eq!(config_path(&raw(&["--config"])), None);
        assert_eq!(config_path(&raw(&["--config", "--root=/r"])), None);
        let not_utf8 = OsStr::from_bytes(b"/etc/polis/\xff.toml");
        let mut with_not_utf8 = raw(&[]);
        with_not_utf8.push([OsStr::new("--config="), not_utf8].join(OsStr::new("")));
        assert_eq!(config_path(&with_not_utf8), Some(PathBuf::from(not_utf8)));
        assert_eq!(config_path(&raw(&[])), None);
    }
}
