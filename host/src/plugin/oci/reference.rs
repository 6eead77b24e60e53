//! `oci://REGISTRY/REPOSITORY[:TAG][@sha256:HEX]`, parsed and checked before anything is
//! dialled: the registry is a host name or address with an optional port (no path, no user
//! info), the repository and tag follow the distribution spec's grammar, and a digest is
//! sha256 in lower-case hex. A reference is text a ConfigMap writer chose; nothing of it is
//! trusted until it parses.

use std::fmt;
use std::str::FromStr;

use sha2::{Digest as _, Sha256};

/// The scheme that marks a registry reference, as `wasmop push` and a plugin ConfigMap write it.
pub const SCHEME: &str = "oci://";
/// Longest reference accepted (Docker's own limit on a name is 255; a digest and tag add more).
const MAX_REFERENCE: usize = 512;

/// `sha256:<64 hex>`: the name of a manifest or blob by its content.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Digest(String);

impl Digest {
    /// The digest of `bytes`.
    pub fn of(bytes: &[u8]) -> Digest {
        Digest::from_hasher(Sha256::new_with_prefix(bytes))
    }

    /// The digest a hasher that has seen every byte gives.
    pub fn from_hasher(hasher: Sha256) -> Digest {
        let hex: String = hasher
            .finalize()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        Digest(format!("sha256:{hex}"))
    }

    /// `sha256:<hex>`.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The hex part alone.
    pub fn hex(&self) -> &str {
        &self.0["sha256:".len()..]
    }
}

impl FromStr for Digest {
    type Err = String;

    fn from_str(s: &str) -> Result<Digest, String> {
        let hex = s
            .strip_prefix("sha256:")
            .ok_or_else(|| format!("digest {s:?} is not sha256:<hex>"))?;
        if hex.len() != 64 || !hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
            return Err(format!(
                "digest {s:?} is not sha256 followed by 64 lower-case hex digits"
            ));
        }
        Ok(Digest(s.to_string()))
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A parsed registry reference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reference {
    /// `host[:port]`.
    pub registry: String,
    /// `path/to/repo`.
    pub repository: String,
    /// The tag, when one was named.
    pub tag: Option<String>,
    /// The digest, when pinned.
    pub digest: Option<Digest>,
}

impl Reference {
    /// What the manifest is asked for by: the digest when pinned, else the tag (`latest`
    /// when neither is named, as every registry client does).
    pub fn manifest_ref(&self) -> &str {
        match (&self.digest, &self.tag) {
            (Some(d), _) => d.as_str(),
            (None, Some(t)) => t,
            (None, None) => "latest",
        }
    }

    /// The same reference pinned to `digest` (the tag kept, for people to read).
    pub fn pinned(&self, digest: Digest) -> Reference {
        Reference {
            digest: Some(digest),
            ..self.clone()
        }
    }

    /// Whether the registry is this machine (`localhost`, `127.0.0.0/8`, `[::1]`): spoken to
    /// over plain HTTP, as Docker and every registry client do; any other over HTTPS.
    pub fn is_loopback(&self) -> bool {
        let host = match self.registry.rsplit_once(':') {
            Some((h, port)) if port.bytes().all(|b| b.is_ascii_digit()) => h,
            _ => &self.registry,
        };
        let host = host.trim_start_matches('[').trim_end_matches(']');
        host == "localhost"
            || host
                .parse::<std::net::IpAddr>()
                .is_ok_and(|ip| ip.is_loopback())
    }

    /// `http://` or `https://` and the registry.
    pub fn base_url(&self) -> String {
        let scheme = if self.is_loopback() { "http" } else { "https" };
        format!("{scheme}://{}", self.registry)
    }
}

impl FromStr for Reference {
    type Err = String;

    fn from_str(s: &str) -> Result<Reference, String> {
        if s.len() > MAX_REFERENCE {
            return Err(format!(
                "a reference is at most {MAX_REFERENCE} bytes, this one {}",
                s.len()
            ));
        }
        let rest = s
            .strip_prefix(SCHEME)
            .ok_or_else(|| format!("{s:?} does not start with {SCHEME}"))?;
        let (name, digest) = match rest.split_once('@') {
            Some((name, d)) => (name, Some(d.parse::<Digest>()?)),
            None => (rest, None),
        };
        let (registry, path) = name
            .split_once('/')
            .ok_or_else(|| format!("{s:?} names no repository: oci://REGISTRY/REPOSITORY"))?;
        check_registry(registry)?;
        // A colon after the last slash starts the tag.
        let (repository, tag) = match path.rsplit_once(':') {
            Some((repo, tag)) if !tag.contains('/') => (repo, Some(tag)),
            _ => (path, None),
        };
        check_repository(repository)?;
        if let Some(tag) = tag {
            check_tag(tag)?;
        }
        Ok(Reference {
            registry: registry.to_string(),
            repository: repository.to_string(),
            tag: tag.map(str::to_string),
            digest,
        })
    }
}

impl fmt::Display for Reference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{SCHEME}{}/{}", self.registry, self.repository)?;
        if let Some(tag) = &self.tag {
            write!(f, ":{tag}")?;
        }
        if let Some(digest) = &self.digest {
            write!(f, "@{digest}")?;
        }
        Ok(())
    }
}

/// `host[:port]`: letters, digits, `.` and `-`, or a bracketed IPv6 address; a port of digits.
fn check_registry(registry: &str) -> Result<(), String> {
    let bad = || format!("registry {registry:?} is not host[:port]");
    let (host, port) = if let Some(rest) = registry.strip_prefix('[') {
        let (addr, after) = rest.split_once(']').ok_or_else(bad)?;
        addr.parse::<std::net::Ipv6Addr>().map_err(|_| bad())?;
        // Nothing but a port may follow the address.
        let port = match after {
            "" => None,
            a => Some(a.strip_prefix(':').ok_or_else(bad)?),
        };
        (None, port)
    } else {
        match registry.split_once(':') {
            Some((h, p)) => (Some(h), Some(p)),
            None => (Some(registry), None),
        }
    };
    if let Some(host) = host {
        let ok = !host.is_empty()
            && host.len() <= 253
            && host
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-')
            && !host.starts_with(['.', '-']);
        if !ok {
            return Err(bad());
        }
    }
    if let Some(port) = port
        && port.parse::<u16>().map_or(true, |p| p == 0)
    {
        return Err(bad());
    }
    Ok(())
}

/// Path components of lower-case letters and digits joined by `.`, `_`, `__` or dashes.
fn check_repository(repository: &str) -> Result<(), String> {
    let component_ok = |c: &str| {
        let b = c.as_bytes();
        !b.is_empty()
            && b[0].is_ascii_lowercase() | b[0].is_ascii_digit()
            && b[b.len() - 1].is_ascii_lowercase() | b[b.len() - 1].is_ascii_digit()
            && b.iter().all(|&x| {
                x.is_ascii_lowercase() || x.is_ascii_digit() || matches!(x, b'.' | b'_' | b'-')
            })
            && !c.contains("..")
            && !c.contains("___")
    };
    if repository.len() > 255 || !repository.split('/').all(component_ok) {
        return Err(format!(
            "repository {repository:?} is not lower-case path components (a-z, 0-9, '.', '_', '-')"
        ));
    }
    Ok(())
}

/// `[A-Za-z0-9_][A-Za-z0-9._-]{0,127}`.
fn check_tag(tag: &str) -> Result<(), String> {
    let b = tag.as_bytes();
    let ok = !b.is_empty()
        && b.len() <= 128
        && (b[0].is_ascii_alphanumeric() || b[0] == b'_')
        && b.iter()
            .all(|&x| x.is_ascii_alphanumeric() || matches!(x, b'.' | b'_' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "tag {tag:?} is not 1 to 128 of A-Z, a-z, 0-9, '.', '_', '-' (not starting with '.' or '-')"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const D: &str = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    #[test]
    fn parses_registry_repository_tag_and_digest() {
        let r: Reference = format!("oci://127.0.0.1:5000/team/memcached:0.1.0@{D}")
            .parse()
            .unwrap();
        assert_eq!(r.registry, "127.0.0.1:5000");
        assert_eq!(r.repository, "team/memcached");
        assert_eq!(r.tag.as_deref(), Some("0.1.0"));
        assert_eq!(r.digest.as_ref().map(Digest::as_str), Some(D));
        assert_eq!(r.manifest_ref(), D);
        assert_eq!(
            r.to_string(),
            format!("oci://127.0.0.1:5000/team/memcached:0.1.0@{D}")
        );
        assert!(r.is_loopback());
        assert_eq!(r.base_url(), "http://127.0.0.1:5000");

        let r: Reference = "oci://ghcr.io/acme/plugins/memcached".parse().unwrap();
        assert_eq!(r.tag, None);
        assert_eq!(r.manifest_ref(), "latest");
        assert!(!r.is_loopback());
        assert_eq!(r.base_url(), "https://ghcr.io");

        let r: Reference = "oci://[::1]:5000/a:v1".parse().unwrap();
        assert!(r.is_loopback());
        let r: Reference = "oci://localhost/a".parse().unwrap();
        assert!(r.is_loopback());
    }

    #[test]
    fn refuses_what_is_not_a_reference() {
        for bad in [
            "ghcr.io/acme/x",                  // no scheme
            "oci://ghcr.io",                   // no repository
            "oci://user:pw@ghcr.io/x",         // user info: '@' then no digest
            "oci://ghcr.io:0/x",               // port 0
            "oci://ghcr.io:99999/x",           // port past u16
            "oci://ghcr.io/Acme/x",            // upper case in the repository
            "oci://ghcr.io/acme//x",           // empty component
            "oci://ghcr.io/acme/x:-tag",       // tag starting with '-'
            "oci://ghcr.io/acme/x@sha256:abc", // short digest
            "oci://ghcr.io/acme/x@md5:0123",   // not sha256
            "oci://ghcr.io/../x",              // '..'
            "oci://gh cr.io/x",                // space in the host
            "oci://-ghcr.io/x",                // host starting with '-'
            "oci://[::1]#x/r",                 // junk after an IPv6 address
            "oci://[::1]x/r",
        ] {
            assert!(bad.parse::<Reference>().is_err(), "{bad} parsed");
        }
        let long = format!("oci://r.io/{}", "a".repeat(600));
        assert!(long.parse::<Reference>().unwrap_err().contains("at most"));
    }

    #[test]
    fn a_digest_is_sha256_of_the_bytes() {
        let d = Digest::of(b"");
        assert_eq!(
            d.as_str(),
            "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        assert_eq!(d.hex().len(), 64);
        assert_eq!(d.as_str().parse::<Digest>().unwrap(), d);
        assert!(D.to_uppercase().parse::<Digest>().is_err());
    }
}
