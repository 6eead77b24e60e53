//! Cosign signatures, key-based: which plugins must be signed and by whom ([`Policy`]), a
//! signature checked ([`OciClient::verify`]) and made ([`OciClient::sign`]).
//!
//! The layout is cosign's: the signatures of manifest `sha256:HEX` are the layers of the
//! manifest tagged `sha256-HEX.sig` in the same repository; each layer is a simple-signing
//! payload (media type [`PAYLOAD_MEDIA_TYPE`]) naming the signed manifest's digest, and its
//! annotation [`SIGNATURE_ANNOTATION`] holds the base64 of an ECDSA P-256 SHA-256 signature of
//! the payload's bytes. A plugin passes when one payload names its manifest and is signed by
//! one of the keys its policy rule lists.
//!
//! The policy is the cluster admin's (a file given to `wasmop run`, mounted from an object
//! the host's RBAC alone may write), never a plugin ConfigMap's: whoever writes ConfigMaps
//! must not also choose who may sign. Keyless signing (Fulcio certificates, Rekor entries)
//! would be another kind of rule; an unknown field is refused, so a policy written for it is
//! never read by this host as "no requirement".

use std::fmt;
use std::str::FromStr;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use bytes::Bytes;
use ring::rand::SystemRandom;
use ring::signature::{
    ECDSA_P256_SHA256_ASN1, ECDSA_P256_SHA256_ASN1_SIGNING, EcdsaKeyPair, KeyPair,
    UnparsedPublicKey,
};
use serde::Deserialize;
use serde_json::json;

use super::{
    Digest, IMAGE_CONFIG_MEDIA_TYPE, MANIFEST_MEDIA_TYPES, Manifest, OciClient, OciError, Reference,
};

/// Media type of a simple-signing payload layer.
pub const PAYLOAD_MEDIA_TYPE: &str = "application/vnd.dev.cosign.simplesigning.v1+json";
/// The layer annotation that holds a payload's signature.
pub const SIGNATURE_ANNOTATION: &str = "dev.cosignproject.cosign/signature";
/// The `critical.type` of a payload.
const PAYLOAD_TYPE: &str = "cosign container image signature";
/// Signatures of one manifest looked at, at most.
const MAX_SIGNATURES: usize = 16;
/// Largest payload fetched.
const MAX_PAYLOAD: u64 = 64 * 1024;
/// The DER prefix of a P-256 public key (SubjectPublicKeyInfo, id-ecPublicKey, prime256v1),
/// followed by the 65-byte uncompressed point.
const P256_SPKI_PREFIX: [u8; 26] = [
    0x30, 0x59, 0x30, 0x13, 0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01, 0x06, 0x08, 0x2a,
    0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07, 0x03, 0x42, 0x00,
];

/// The tag under which cosign keeps the signatures of `manifest`.
pub fn signature_tag(manifest: &Digest) -> String {
    format!("sha256-{}.sig", manifest.hex())
}

/// A public key a policy trusts: ECDSA P-256, as `cosign generate-key-pair` makes.
#[derive(Clone, PartialEq, Eq)]
pub struct PublicKey {
    // The uncompressed point.
    point: Vec<u8>,
}

impl PublicKey {
    /// The first 16 hex digits of the SHA-256 of the key's DER: what messages name it by.
    pub fn fingerprint(&self) -> String {
        Digest::of(&self.der()).hex()[..16].to_string()
    }

    fn der(&self) -> Vec<u8> {
        [&P256_SPKI_PREFIX[..], &self.point].concat()
    }

    /// The key as PEM (`-----BEGIN PUBLIC KEY-----`).
    pub fn to_pem(&self) -> String {
        pem("PUBLIC KEY", &self.der())
    }
}

impl fmt::Debug for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PublicKey({})", self.fingerprint())
    }
}

impl FromStr for PublicKey {
    type Err = String;

    fn from_str(text: &str) -> Result<PublicKey, String> {
        let der = unpem("PUBLIC KEY", text)?;
        match der.strip_prefix(&P256_SPKI_PREFIX[..]) {
            Some(point) if point.len() == 65 && point[0] == 4 => Ok(PublicKey {
                point: point.to_vec(),
            }),
            _ => Err("not an ECDSA P-256 public key (cosign's keys are)".into()),
        }
    }
}

/// A private key that signs: ECDSA P-256, unencrypted PKCS#8 PEM (`-----BEGIN PRIVATE
/// KEY-----`, as `openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256` writes).
pub struct SigningKey {
    pair: EcdsaKeyPair,
}

impl SigningKey {
    /// A new random key, and its PKCS#8 PEM to keep.
    pub fn generate() -> (SigningKey, String) {
        let rng = SystemRandom::new();
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, &rng)
            .expect("the system has randomness");
        let pem = pem("PRIVATE KEY", pkcs8.as_ref());
        (pem.parse().expect("a generated key parses"), pem)
    }

    /// The key that checks this key's signatures.
    pub fn public_key(&self) -> PublicKey {
        PublicKey {
            point: self.pair.public_key().as_ref().to_vec(),
        }
    }

    fn sign(&self, payload: &[u8]) -> Vec<u8> {
        self.pair
            .sign(&SystemRandom::new(), payload)
            .expect("ECDSA signing with system randomness")
            .as_ref()
            .to_vec()
    }
}

impl FromStr for SigningKey {
    type Err = String;

    fn from_str(text: &str) -> Result<SigningKey, String> {
        let der = unpem("PRIVATE KEY", text).map_err(|e| {
            if text.contains("ENCRYPTED") {
                format!("{e}; an encrypted key must be decrypted first")
            } else {
                e
            }
        })?;
        let pair =
            EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, &der, &SystemRandom::new())
                .map_err(|e| format!("not an ECDSA P-256 PKCS#8 key: {e}"))?;
        Ok(SigningKey { pair })
    }
}

fn pem(label: &str, der: &[u8]) -> String {
    let body = STANDARD.encode(der);
    let lines: Vec<&str> = body
        .as_bytes()
        .chunks(64)
        .map(|c| std::str::from_utf8(c).expect("base64 is ASCII"))
        .collect();
    format!(
        "-----BEGIN {label}-----\n{}\n-----END {label}-----\n",
        lines.join("\n")
    )
}

fn unpem(label: &str, text: &str) -> Result<Vec<u8>, String> {
    let begin = format!("-----BEGIN {label}-----");
    let end = format!("-----END {label}-----");
    let start = text
        .find(&begin)
        .ok_or_else(|| format!("no {begin} block"))?
        + begin.len();
    let stop = text[start..]
        .find(&end)
        .ok_or_else(|| format!("no {end} line"))?
        + start;
    let body: String = text[start..stop]
        .chars()
        .filter(|c| !c.is_whitespace())
        .collect();
    STANDARD
        .decode(body)
        .map_err(|e| format!("the {label} block is not base64: {e}"))
}

/// The payload that signs `manifest` as `reference`'s (its registry and repository).
pub fn payload(reference: &Reference, manifest: &Digest) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "critical": {
            "identity": {"docker-reference": format!("{}/{}", reference.registry, reference.repository)},
            "image": {"docker-manifest-digest": manifest.as_str()},
            "type": PAYLOAD_TYPE,
        },
        "optional": null,
    }))
    .expect("JSON serialises")
}

/// Who must have signed which plugins. A plugin's reference takes the first rule whose
/// `match` it fits; one that fits none is taken unsigned unless `unmatched` is `refuse`.
///
/// ```
/// use wasmop::plugin::oci::{Policy, Reference, Requirement};
///
/// let policy: Policy = serde_yaml::from_str("rules: []\nunmatched: refuse\n").unwrap();
/// let r: Reference = "oci://registry.example/team/memcached@sha256:0000000000000000000000000000000000000000000000000000000000000000".parse().unwrap();
/// assert!(matches!(policy.requirement(&r), Requirement::Refused));
/// ```
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Policy {
    /// The rules, first match wins.
    #[serde(default)]
    pub rules: Vec<Rule>,
    /// What a reference no rule matches gets.
    #[serde(default)]
    pub unmatched: Unmatched,
}

/// One rule of a [`Policy`].
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rule {
    /// `REGISTRY/REPOSITORY`, or a prefix ending in `/*` (`registry.example/team/*`), or `*`.
    #[serde(rename = "match")]
    pub matches: String,
    /// Keys of which one must have signed (PEM).
    #[serde(deserialize_with = "keys")]
    pub keys: Vec<PublicKey>,
}

/// What a reference that no rule matches gets.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Unmatched {
    /// Loaded without a signature.
    #[default]
    Allow,
    /// Refused.
    Refuse,
}

/// What a policy asks of one reference.
#[derive(Debug)]
pub enum Requirement<'a> {
    /// Nothing.
    None,
    /// A signature by one of these keys.
    Signed(&'a [PublicKey]),
    /// Not to be loaded at all.
    Refused,
}

fn keys<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<PublicKey>, D::Error> {
    let pems = Vec::<String>::deserialize(d)?;
    if pems.is_empty() {
        return Err(serde::de::Error::custom(
            "a rule needs at least one key (a rule with none could never pass)",
        ));
    }
    pems.iter()
        .enumerate()
        .map(|(i, p)| {
            p.parse()
                .map_err(|e| serde::de::Error::custom(format!("keys[{i}]: {e}")))
        })
        .collect()
}

impl Policy {
    /// Reads the policy file at `path`.
    pub fn load(path: &std::path::Path) -> anyhow::Result<Policy> {
        use anyhow::Context as _;
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading the signature policy {}", path.display()))?;
        serde_yaml::from_str(&text)
            .with_context(|| format!("the signature policy {}", path.display()))
    }

    /// What `reference` must satisfy.
    pub fn requirement(&self, reference: &Reference) -> Requirement<'_> {
        let name = format!("{}/{}", reference.registry, reference.repository);
        let fits = |pattern: &str| match pattern.strip_suffix("*") {
            Some("") => true,
            Some(prefix) => prefix.ends_with('/') && name.starts_with(prefix),
            None => pattern == name,
        };
        match self.rules.iter().find(|r| fits(&r.matches)) {
            Some(rule) => Requirement::Signed(&rule.keys),
            None if self.unmatched == Unmatched::Refuse => Requirement::Refused,
            None => Requirement::None,
        }
    }
}

/// Why a plugin's signature did not pass.
#[derive(Debug, thiserror::Error)]
pub enum SignatureError {
    /// No signature manifest at all.
    #[error("not signed: no signatures at tag {tag} (the policy requires one by {keys})")]
    Unsigned {
        /// Where they were looked for.
        tag: String,
        /// The keys' fingerprints.
        keys: String,
    },
    /// Signatures, none that passes.
    #[error("no valid signature by {keys} among {count}: {reasons}")]
    Invalid {
        /// The keys' fingerprints.
        keys: String,
        /// Signatures looked at.
        count: usize,
        /// Why each failed.
        reasons: String,
    },
    /// The policy refuses references no rule matches.
    #[error("the signature policy names no key for this repository and refuses the rest")]
    Refused,
    /// The registry's answer.
    #[error(transparent)]
    Registry(#[from] OciError),
}

impl OciClient {
    /// Checks that a signature by one of `keys` vouches for `manifest` in `reference`'s
    /// repository, all of it within the client's timeout; returns the fingerprint of the key
    /// that signed.
    pub async fn verify(
        &self,
        reference: &Reference,
        manifest: &Digest,
        keys: &[PublicKey],
    ) -> Result<String, SignatureError> {
        self.within(reference, self.verify_unbounded(reference, manifest, keys))
            .await
    }

    async fn verify_unbounded(
        &self,
        reference: &Reference,
        manifest: &Digest,
        keys: &[PublicKey],
    ) -> Result<String, SignatureError> {
        let fingerprints = keys
            .iter()
            .map(PublicKey::fingerprint)
            .collect::<Vec<_>>()
            .join(", ");
        let tag = signature_tag(manifest);
        let at = Reference {
            tag: Some(tag.clone()),
            digest: None,
            ..reference.clone()
        };
        let bytes = match self.manifest(&at).await {
            Ok((bytes, _)) => bytes,
            Err(OciError::Status { status: 404, .. }) => {
                return Err(SignatureError::Unsigned {
                    tag,
                    keys: fingerprints,
                });
            }
            Err(e) => return Err(e.into()),
        };
        let signatures: Manifest =
            serde_json::from_slice(&bytes).map_err(|e| OciError::Manifest {
                reference: at.to_string(),
                reason: format!("not an image manifest: {e}"),
            })?;
        let mut reasons = Vec::new();
        let layers = signatures
            .layers
            .iter()
            .filter(|l| l.media_type == PAYLOAD_MEDIA_TYPE)
            .take(MAX_SIGNATURES);
        for (i, layer) in layers.enumerate() {
            match self.check(&at, layer, manifest, keys).await {
                Ok(Some(key)) => return Ok(key),
                Ok(None) => reasons.push(format!("[{i}] signed by no listed key")),
                Err(reason) => reasons.push(format!("[{i}] {reason}")),
            }
        }
        Err(SignatureError::Invalid {
            keys: fingerprints,
            count: reasons.len(),
            reasons: if reasons.is_empty() {
                "the signature manifest has no payload layers".into()
            } else {
                reasons.join("; ")
            },
        })
    }

    /// One payload layer: its signature checked against each key, then what it names.
    async fn check(
        &self,
        at: &Reference,
        layer: &super::Descriptor,
        manifest: &Digest,
        keys: &[PublicKey],
    ) -> Result<Option<String>, String> {
        let signature = layer
            .annotations
            .get(SIGNATURE_ANNOTATION)
            .ok_or_else(|| format!("no {SIGNATURE_ANNOTATION} annotation"))?;
        let signature = STANDARD
            .decode(signature.trim())
            .map_err(|e| format!("the signature is not base64: {e}"))?;
        if layer.size > MAX_PAYLOAD {
            return Err(format!(
                "a payload of {} bytes (at most {MAX_PAYLOAD})",
                layer.size
            ));
        }
        let digest: Digest = layer.digest.parse()?;
        let payload = self
            .blob(at, &digest, layer.size)
            .await
            .map_err(|e| e.to_string())?;
        let Some(key) = keys.iter().find(|k| {
            UnparsedPublicKey::new(&ECDSA_P256_SHA256_ASN1, &k.point)
                .verify(&payload, &signature)
                .is_ok()
        }) else {
            return Ok(None);
        };
        // Signed by a trusted key; now it must be about this manifest.
        let claims: serde_json::Value = serde_json::from_slice(&payload)
            .map_err(|e| format!("the payload is not JSON: {e}"))?;
        let critical = &claims["critical"];
        if critical["type"] != PAYLOAD_TYPE {
            return Err(format!(
                "a payload of type {}, not {PAYLOAD_TYPE:?}",
                critical["type"]
            ));
        }
        let named = critical["image"]["docker-manifest-digest"]
            .as_str()
            .unwrap_or("no manifest");
        if named != manifest.as_str() {
            return Err(format!("a signature of {named}, not {manifest}"));
        }
        Ok(Some(key.fingerprint()))
    }

    /// Signs `manifest` in `reference`'s repository with `key`, as cosign does: a payload
    /// layer added to the manifest at [`signature_tag`] (created when there is none).
    /// Returns the signature manifest's digest.
    pub async fn sign(
        &self,
        reference: &Reference,
        manifest: &Digest,
        key: &SigningKey,
    ) -> Result<Digest, OciError> {
        let tag = signature_tag(manifest);
        let at = Reference {
            tag: Some(tag.clone()),
            digest: None,
            ..reference.clone()
        };
        let payload = payload(reference, manifest);
        let signature = STANDARD.encode(key.sign(&payload));
        let payload_digest = Digest::of(&payload);
        let mut layers = match self.manifest(&at).await {
            Ok((bytes, _)) => {
                let existing: serde_json::Value =
                    serde_json::from_slice(&bytes).map_err(|e| OciError::Manifest {
                        reference: at.to_string(),
                        reason: format!("not an image manifest: {e}"),
                    })?;
                existing["layers"].as_array().cloned().unwrap_or_default()
            }
            Err(OciError::Status { status: 404, .. }) => Vec::new(),
            Err(e) => return Err(e),
        };
        // Signing again with the same key replaces that key's signature, so that signing on
        // every push never buries other keys' signatures past what a verifier looks at.
        let public = key.public_key();
        layers.retain(|layer| {
            let same_payload = layer["digest"].as_str() == Some(payload_digest.as_str());
            let by_this_key = layer["annotations"][SIGNATURE_ANNOTATION]
                .as_str()
                .and_then(|s| STANDARD.decode(s).ok())
                .is_some_and(|sig| {
                    UnparsedPublicKey::new(&ECDSA_P256_SHA256_ASN1, &public.point)
                        .verify(&payload, &sig)
                        .is_ok()
                });
            !(same_payload && by_this_key)
        });
        layers.push(json!({
            "mediaType": PAYLOAD_MEDIA_TYPE,
            "digest": payload_digest.as_str(),
            "size": payload.len(),
            "annotations": {SIGNATURE_ANNOTATION: signature},
        }));
        let diff_ids: Vec<&str> = layers.iter().filter_map(|l| l["digest"].as_str()).collect();
        let config = serde_json::to_vec(&json!({
            "architecture": "",
            "os": "",
            "config": {},
            "rootfs": {"type": "layers", "diff_ids": diff_ids},
        }))
        .expect("JSON serialises");
        let config_digest = Digest::of(&config);
        self.upload(&at, &payload_digest, Bytes::from(payload))
            .await?;
        self.upload(&at, &config_digest, Bytes::from(config.clone()))
            .await?;
        let signatures = serde_json::to_vec(&json!({
            "schemaVersion": 2,
            "mediaType": MANIFEST_MEDIA_TYPES[0],
            "config": {
                "mediaType": IMAGE_CONFIG_MEDIA_TYPE,
                "digest": config_digest.as_str(),
                "size": config.len(),
            },
            "layers": layers,
        }))
        .expect("JSON serialises");
        let digest = Digest::of(&signatures);
        self.put_manifest(&at, &tag, signatures).await?;
        Ok(digest)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reference(s: &str) -> Reference {
        s.parse().unwrap()
    }

    #[test]
    fn keys_round_trip_through_pem_and_sign_what_they_claim() {
        let (key, pem) = SigningKey::generate();
        let again: SigningKey = pem.parse().unwrap();
        let public: PublicKey = key.public_key().to_pem().parse().unwrap();
        assert_eq!(public, again.public_key());
        let r = reference("oci://127.0.0.1:5000/team/x:1");
        let digest = Digest::of(b"manifest");
        let payload = payload(&r, &digest);
        let signature = key.sign(&payload);
        let verify = |k: &PublicKey, p: &[u8]| {
            UnparsedPublicKey::new(&ECDSA_P256_SHA256_ASN1, &k.point)
                .verify(p, &signature)
                .is_ok()
        };
        assert!(verify(&public, &payload));
        assert!(!verify(&public, &payload[1..]));
        let (other, _) = SigningKey::generate();
        assert!(!verify(&other.public_key(), &payload));
        assert!(
            String::from_utf8(payload)
                .unwrap()
                .contains(digest.as_str())
        );
    }

    #[test]
    fn keys_that_are_not_p256_are_refused_by_name() {
        assert!(
            "-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----"
                .parse::<PublicKey>()
                .unwrap_err()
                .contains("P-256")
        );
        assert!(
            "hello"
                .parse::<PublicKey>()
                .unwrap_err()
                .contains("BEGIN PUBLIC KEY")
        );
        let encrypted =
            "-----BEGIN ENCRYPTED PRIVATE KEY-----\nAAAA\n-----END ENCRYPTED PRIVATE KEY-----";
        assert!(
            encrypted
                .parse::<SigningKey>()
                .err()
                .unwrap()
                .contains("decrypted")
        );
    }

    #[test]
    fn a_policy_takes_the_first_rule_that_fits_and_refuses_unknown_fields() {
        let (a, _) = SigningKey::generate();
        let (b, _) = SigningKey::generate();
        let text = format!(
            "rules:\n- match: reg.example/team/special\n  keys: [{:?}]\n- match: reg.example/team/*\n  keys: [{:?}]\nunmatched: refuse\n",
            a.public_key().to_pem(),
            b.public_key().to_pem()
        );
        let policy: Policy = serde_yaml::from_str(&text).unwrap();
        let keys = |r: &str| match policy.requirement(&reference(r)) {
            Requirement::Signed(k) => Some(k.to_vec()),
            Requirement::Refused => None,
            Requirement::None => panic!("{r}: no requirement"),
        };
        assert_eq!(
            keys("oci://reg.example/team/special:1"),
            Some(vec![a.public_key()])
        );
        assert_eq!(
            keys("oci://reg.example/team/other:1"),
            Some(vec![b.public_key()])
        );
        // `team/*` is under team/, not a name that starts with "team".
        assert_eq!(keys("oci://reg.example/teammate/x:1"), None);
        assert_eq!(keys("oci://other.example/team/x:1"), None);

        let open: Policy = serde_yaml::from_str("rules: []").unwrap();
        assert!(matches!(
            open.requirement(&reference("oci://reg.example/x:1")),
            Requirement::None
        ));
        let keyless = "rules:\n- match: '*'\n  keyless: {issuer: https://accounts.example}\n";
        assert!(serde_yaml::from_str::<Policy>(keyless).is_err());
        let empty = "rules:\n- match: '*'\n  keys: []\n";
        let err = serde_yaml::from_str::<Policy>(empty).unwrap_err();
        assert!(err.to_string().contains("at least one key"), "{err}");
    }
}
