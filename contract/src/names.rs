//! The name rules Kubernetes applies, which the manifest and the output rules check first.

/// `[a-z0-9]([-a-z0-9]*[a-z0-9])?`, at most 63 characters.
pub fn is_dns1123_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// DNS-1123 labels joined by dots, at most 253 characters.
pub fn is_dns1123_subdomain(s: &str) -> bool {
    s.len() <= 253
        && s.split('.').all(|label| {
            !label.is_empty()
                && label
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

/// `version` or `group/version`.
pub(crate) fn is_api_version(s: &str) -> bool {
    match s.split_once('/') {
        Some((group, version)) => is_dns1123_subdomain(group) && is_dns1123_label(version),
        None => is_dns1123_label(s),
    }
}

/// An UpperCamelCase identifier of at most 63 characters.
pub(crate) fn is_kind_name(s: &str) -> bool {
    s.len() <= 63
        && s.starts_with(|c: char| c.is_ascii_uppercase())
        && s.chars().all(|c| c.is_ascii_alphanumeric())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert!(is_dns1123_label("a-b-1"));
        assert!(!is_dns1123_label("-a"));
        assert!(!is_dns1123_label(&"a".repeat(64)));
        assert!(is_dns1123_subdomain("web.example-1.com"));
        assert!(!is_dns1123_subdomain("web..com"));
        assert!(!is_dns1123_subdomain("Web"));
    }
}
