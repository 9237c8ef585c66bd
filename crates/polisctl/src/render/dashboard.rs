//! `dashboard`: what the live view shows, drawn from a `DashboardState` alone (pure: no
//! calls, no clock, no terminal of its own), so it is tested on ratatui's `TestBackend`.
//! May not talk to the cluster nor read the keyboard (`commands::dashboard` does).

use std::collections::VecDeque;

use proto::api;
use ratatui::Frame;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Modifier, Style};
use ratatui::text::Line;
use ratatui::widgets::{Block, Borders, Paragraph, Row, Table};

use crate::consensus_summary::MemberStatus;
use crate::names::{health_name, state_name};
use crate::output::{escape, utc_time};

/// Most audit entries kept (the newest); the view shows as many as fit.
pub(crate) const AUDIT_KEPT: usize = 200;

/// Everything the dashboard shows; `None` / empty until the first answer came.
#[derive(Debug, Default)]
pub(crate) struct DashboardState {
    /// The nodes as the last `ListNodes` answered (`None`: no answer yet).
    pub(crate) nodes: Option<Vec<api::NodeInfo>>,
    /// The etcd members as the curators' own members answered (`None`: no answer yet).
    pub(crate) members: Option<Vec<MemberStatus>>,
    pub(crate) quorum: bool,
    /// The curator leader's node ID.
    pub(crate) curator_leader: Option<String>,
    /// The newest audit entries, oldest first.
    pub(crate) audit: VecDeque<api::AuditEntry>,
    /// Whether the audit stream has delivered its backlog (or any entry).
    pub(crate) audit_open: bool,
    /// The latest problems reaching the cluster, by source ("nodes", "consensus", "audit").
    pub(crate) errors: Vec<(String, String)>,
}

impl DashboardState {
    /// Adds an audit entry, dropping the oldest past `AUDIT_KEPT`.
    pub(crate) fn push_audit(&mut self, entry: api::AuditEntry) {
        self.audit_open = true;
        self.audit.push_back(entry);
        while self.audit.len() > AUDIT_KEPT {
            self.audit.pop_front();
        }
    }

    /// Records (`Some`) or clears (`None`) the problem of one source.
    pub(crate) fn set_error(&mut self, source: &str, error: Option<String>) {
        self.errors.retain(|(s, _)| s != source);
        if let Some(e) = error {
            self.errors.push((source.to_string(), e));
        }
    }
}

const LEADER: &str = "LEADER";
/// A node ID's width ("polis-" and 32 hex digits).
const ID_WIDTH: u16 = 38;

/// Draws the whole view on `frame`.
pub(crate) fn draw(frame: &mut Frame, state: &DashboardState) {
    let node_rows = state.nodes.as_ref().map_or(1, |n| n.len().max(1)) as u16;
    let member_rows = state.members.as_ref().map_or(1, |m| m.len().max(1)) as u16;
    let [title, nodes, members, audit, errors] = Layout::vertical([
        Constraint::Length(1),
        Constraint::Length(node_rows + 3),
        Constraint::Length(member_rows + 3),
        Constraint::Min(4),
        Constraint::Length(state.errors.len() as u16),
    ])
    .areas(frame.area());
    frame.render_widget(
        Line::from("polis dashboard — q quits").style(Style::new().add_modifier(Modifier::BOLD)),
        title,
    );
    draw_nodes(frame, nodes, state);
    draw_members(frame, members, state);
    draw_audit(frame, audit, state);
    let lines: Vec<Line> = state
        .errors
        .iter()
        .map(|(source, e)| Line::from(escape(&format!("{source}: {e}")).into_owned()))
        .collect();
    frame.render_widget(Paragraph::new(lines), errors);
}

fn block(title: String) -> Block<'static> {
    Block::new().borders(Borders::TOP).title(title)
}

fn header(cells: &[&'static str]) -> Row<'static> {
    Row::new(cells.to_vec()).style(Style::new().add_modifier(Modifier::BOLD))
}

fn placeholder(frame: &mut Frame, area: Rect, title: String, text: &str) {
    frame.render_widget(Paragraph::new(text.to_string()).block(block(title)), area);
}

fn draw_nodes(frame: &mut Frame, area: Rect, state: &DashboardState) {
    let nodes = match &state.nodes {
        None => return placeholder(frame, area, "Nodes".into(), "waiting for the cluster…"),
        Some(n) if n.is_empty() => return placeholder(frame, area, "Nodes".into(), "no nodes"),
        Some(n) => n,
    };
    let rows = nodes.iter().map(|n| {
        let heartbeat = n
            .time_since_heartbeat_ms
            .map_or("-".to_string(), |ms| format!("{:.1}s", ms as f64 / 1000.0));
        let curator = if state.curator_leader.as_deref() == Some(n.id.as_str()) {
            LEADER
        } else {
            ""
        };
        Row::new(vec![
            escape(&n.id).into_owned(),
            state_name(n.state),
            health_name(n.health),
            heartbeat,
            escape(&n.roles.join(",")).into_owned(),
            escape(&n.address).into_owned(),
            curator.to_string(),
        ])
    });
    let table = Table::new(
        rows,
        [
            Constraint::Length(ID_WIDTH),
            Constraint::Length(15),
            Constraint::Length(17),
            Constraint::Length(9),
            Constraint::Length(16),
            Constraint::Length(16),
            Constraint::Length(7),
        ],
    )
    .header(header(&[
        "ID",
        "STATE",
        "HEALTH",
        "HEARTBEAT",
        "ROLES",
        "ADDRESS",
        "CURATOR",
    ]))
    .block(block(format!("Nodes ({})", nodes.len())));
    frame.render_widget(table, area);
}

fn draw_members(frame: &mut Frame, area: Rect, state: &DashboardState) {
    let title = |n: usize| {
        let quorum = if state.quorum { "quorum" } else { "NO QUORUM" };
        format!("Consensus members ({n}, {quorum})")
    };
    let members = match &state.members {
        None => return placeholder(frame, area, title(0), "waiting for the cluster…"),
        Some(m) if m.is_empty() => {
            return placeholder(frame, area, title(0), "no members answered");
        }
        Some(m) => m,
    };
    let rows = members.iter().map(|m| {
        let etcd = if m.learner {
            "learner"
        } else if m.leader {
            LEADER
        } else {
            "follower"
        };
        let curator = if state.curator_leader.as_deref() == Some(m.node.as_str()) {
            LEADER
        } else {
            ""
        };
        let (index, db) = match (m.raft, m.db) {
            (Some((index, _)), Some((size, in_use))) => (
                index.to_string(),
                format!(
                    "{} ({} in use)",
                    proto::quota::show(size.max(0) as u64),
                    proto::quota::show(in_use.max(0) as u64)
                ),
            ),
            _ => ("-".to_string(), "no answer".to_string()),
        };
        Row::new(vec![
            format!("{:016x}", m.id),
            escape(&m.node).into_owned(),
            etcd.to_string(),
            curator.to_string(),
            index,
            db,
        ])
    });
    let table = Table::new(
        rows,
        [
            Constraint::Length(16),
            Constraint::Length(ID_WIDTH),
            Constraint::Length(8),
            Constraint::Length(7),
            Constraint::Length(10),
            Constraint::Min(20),
        ],
    )
    .header(header(&[
        "MEMBER",
        "NODE",
        "ETCD",
        "CURATOR",
        "RAFT INDEX",
        "DB SIZE",
    ]))
    .block(block(title(members.len())));
    frame.render_widget(table, area);
}

/// One audit entry on one line.
pub(crate) fn audit_line(e: &api::AuditEntry) -> String {
    let method = e.method.rsplit('/').next().unwrap_or(&e.method);
    let result = if e.code == 0 {
        "OK".to_string()
    } else {
        format!("{}: {}", e.code_name, e.message)
    };
    format!(
        "{}  {:<24} {:<38} {} {}  {}",
        utc_time(e.time_unix_micros / 1000),
        escape(method),
        escape(&e.target),
        escape(&e.identity_kind),
        escape(&e.identity),
        escape(&result)
    )
}

fn draw_audit(frame: &mut Frame, area: Rect, state: &DashboardState) {
    let title = "Audit log (newest last)".to_string();
    if state.audit.is_empty() {
        let text = if state.audit_open {
            "no audit entries"
        } else {
            "waiting for the audit log…"
        };
        return placeholder(frame, area, title, text);
    }
    // The newest entries that fit below the title line.
    let fit = area.height.saturating_sub(1) as usize;
    let skip = state.audit.len().saturating_sub(fit);
    let lines: Vec<Line> = state
        .audit
        .iter()
        .skip(skip)
        .map(|e| Line::from(audit_line(e)))
        .collect();
    frame.render_widget(Paragraph::new(lines).block(block(title)), area);
}

#[cfg(test)]
mod tests {
    use ratatui::Terminal;
    use ratatui::backend::TestBackend;

    use super::*;

    const NODE_A: &str = "polis-aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
    const NODE_B: &str = "polis-bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";

    /// The screen as lines of text.
    fn screen(state: &DashboardState) -> Vec<String> {
        let mut terminal = Terminal::new(TestBackend::new(160, 40)).unwrap();
        terminal.draw(|f| draw(f, state)).unwrap();
        let buffer = terminal.backend().buffer();
        (0..buffer.area.height)
            .map(|y| {
                (0..buffer.area.width)
                    .map(|x| buffer[(x, y)].symbol())
                    .collect::<String>()
            })
            .collect()
    }

    fn line_with<'a>(lines: &'a [String], what: &str) -> &'a str {
        lines
            .iter()
            .find(|l| l.contains(what))
            .unwrap_or_else(|| panic!("no line with {what:?} in\n{}", lines.join("\n")))
    }

    fn node(id: &str, address: &str) -> api::NodeInfo {
        api::NodeInfo {
            id: id.to_string(),
            state: api::NodeState::Up as i32,
            health: api::NodeHealth::Healthy as i32,
            roles: vec!["ConsensusMember".to_string()],
            address: address.to_string(),
            time_since_heartbeat_ms: Some(1500),
            ..Default::default()
        }
    }

    fn member(id: u64, node: &str, leader: bool) -> MemberStatus {
        MemberStatus {
            id,
            node: node.to_string(),
            learner: false,
            leader,
            raft: Some((4242, 3)),
            db: Some((2 << 20, 1 << 20)),
            ..Default::default()
        }
    }

    #[test]
    fn an_empty_state_says_it_waits() {
        let lines = screen(&DashboardState::default());
        assert!(line_with(&lines, "Nodes").contains("Nodes"));
        assert_eq!(
            lines
                .iter()
                .filter(|l| l.contains("waiting for the cluster…"))
                .count(),
            2,
            "{}",
            lines.join("\n")
        );
        line_with(&lines, "waiting for the audit log…");
        let answered = DashboardState {
            nodes: Some(vec![]),
            members: Some(vec![]),
            audit_open: true,
            ..Default::default()
        };
        let lines = screen(&answered);
        line_with(&lines, "no nodes");
        line_with(&lines, "no members answered");
        line_with(&lines, "no audit entries");
    }

    #[test]
    fn nodes_members_and_audit_entries_show() {
        let mut state = DashboardState {
            nodes: Some(vec![node(NODE_A, "127.0.0.4"), node(NODE_B, "127.0.0.5")]),
            members: Some(vec![
                member(0xab, NODE_A, false),
                member(0xcd, NODE_B, true),
            ]),
            quorum: true,
            curator_leader: Some(NODE_A.to_string()),
            ..Default::default()
        };
        state.push_audit(api::AuditEntry {
            time_unix_micros: 951_782_400_000_000,
            identity_kind: "owner".into(),
            identity: "0badcafe".into(),
            method: "/polis.api.Management/ApproveNode".into(),
            target: NODE_B.into(),
            code: 0,
            code_name: "OK".into(),
            ..Default::default()
        });
        state.set_error("nodes", Some("curator unreachable".into()));
        let lines = screen(&state);

        let row = line_with(&lines, "127.0.0.4");
        for want in [NODE_A, "UP", "HEALTHY", "1.5s", "ConsensusMember", "LEADER"] {
            assert!(row.contains(want), "node row {row:?} lacks {want:?}");
        }
        assert!(!line_with(&lines, "127.0.0.5").contains(LEADER));

        line_with(&lines, "Consensus members (2, quorum)");
        let leader = line_with(&lines, "00000000000000cd");
        for want in [NODE_B, "LEADER", "4242", "2MiB (1MiB in use)"] {
            assert!(
                leader.contains(want),
                "member row {leader:?} lacks {want:?}"
            );
        }
        let follower = line_with(&lines, "00000000000000ab");
        assert!(follower.contains("follower"), "{follower:?}");
        // The curator leader (A) is marked on its member row too.
        assert!(follower.contains(LEADER), "{follower:?}");

        let audit = line_with(&lines, "ApproveNode");
        for want in ["2000-02-29T00:00:00Z", NODE_B, "owner 0badcafe", "OK"] {
            assert!(audit.contains(want), "audit line {audit:?} lacks {want:?}");
        }
        line_with(&lines, "nodes: curator unreachable");
    }

    #[test]
    fn escape_sequences_from_the_cluster_are_shown_escaped() {
        let mut state = DashboardState {
            nodes: Some(vec![node(NODE_A, "127.0.0.4\u{202e}")]),
            ..Default::default()
        };
        state.push_audit(api::AuditEntry {
            method: "/polis.api.Management/UpdateNodeLabels".into(),
            target: "polis-\x1b[31m".into(),
            ..Default::default()
        });
        let lines = screen(&state);
        line_with(&lines, "polis-\\x1b[31m");
        // (The address column is 16 wide: the escape is cut, but shown.)
        line_with(&lines, "127.0.0.4\\u{202");
    }

    #[test]
    fn only_the_newest_audit_entries_are_kept_and_shown() {
        let mut state = DashboardState::default();
        for i in 0..(AUDIT_KEPT + 10) {
            state.push_audit(api::AuditEntry {
                method: format!("/polis.api.Management/Call{i:04}"),
                ..Default::default()
            });
        }
        assert_eq!(state.audit.len(), AUDIT_KEPT);
        let lines = screen(&state);
        let last = format!("Call{:04}", AUDIT_KEPT + 9);
        line_with(&lines, &last);
        assert!(!lines.iter().any(|l| l.contains("Call0000")));
    }
}
