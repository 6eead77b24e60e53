//! Small text helpers shared by every stage: bounding what goes into logs, Events and
//! conditions, what an API error says, and hex for digests.

/// Cuts `s` to at most `max` bytes (on a character boundary), marking the cut with `…`.
pub fn truncate(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut end = max;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
        s.push('…');
    }
    s
}

/// What the API server said, without kube's debug dump of its `Status`: for a refused write,
/// `secrets "x" is forbidden: User "…" cannot create resource "secrets" in API group "" in the
/// namespace "ns"`, which names the verb and the resource.
pub fn api_error(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(status) if !status.message.is_empty() => {
            format!("{} ({})", status.message, status.code)
        }
        e => chain(e),
    }
}

/// `error` and every cause below it, `: `-separated, each said once: a connection error's
/// top level (`client error (Connect)`) rarely says that it timed out; its cause does.
pub fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(e) = cause {
        let next = e.to_string();
        if !text.contains(&next) {
            text.push_str(": ");
            text.push_str(&next);
        }
        cause = e.source();
    }
    text
}

/// Whether the API server refused the request for lack of rights.
pub fn is_forbidden(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(status) if status.code == 403)
}

/// Lower-case hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    bytes
        .iter()
        .fold(String::with_capacity(bytes.len() * 2), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
}

#[cfg(test)]
mod tests {
    use super::{chain, hex, truncate};

    #[test]
    fn a_chain_names_every_cause_once() {
        #[derive(Debug, thiserror::Error)]
        #[error("client error (Connect)")]
        struct Connect(#[source] std::io::Error);
        #[derive(Debug, thiserror::Error)]
        #[error("ServiceError: {0}")]
        struct Service(#[source] Connect);
        let timed_out = std::io::Error::new(std::io::ErrorKind::TimedOut, "deadline has elapsed");
        let e = Service(Connect(timed_out));
        assert_eq!(
            chain(&e),
            "ServiceError: client error (Connect): deadline has elapsed"
        );
    }

    #[test]
    fn hex_is_lower_case() {
        assert_eq!(hex(&[0, 0xab, 0x10]), "00ab10");
    }

    #[test]
    fn cuts_on_a_character_boundary_and_marks_the_cut() {
        assert_eq!(truncate("abc".into(), 10), "abc");
        assert_eq!(truncate("abcdef".into(), 3), "abc…");
        assert_eq!(truncate("héllo".into(), 2), "h…");
    }
}
