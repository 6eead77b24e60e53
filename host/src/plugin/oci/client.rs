//! The part of the OCI distribution API a plugin needs: a manifest and one blob pulled, a
//! module pushed. Every answer is bounded before it is read: a manifest by
//! [`Limits::manifest_bytes`], a blob by its descriptor's size and [`Limits::blob_bytes`]
//! (refused before a byte is fetched when the descriptor is larger, cut off when the body runs
//! past what the descriptor said), every exchange by [`Limits::timeout`]. What comes back is
//! hashed as it arrives and must have the digest it was asked by. A redirect is followed only
//! within the registry's own origin; anywhere else is an error naming both.
//!
//! Credentials are basic (a `kubernetes.io/dockerconfigjson` Secret's entry for the
//! registry); a registry that answers with a Bearer challenge is asked for a token at its
//! realm with them, as the distribution spec's token flow says.

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, Request, Response, StatusCode, Uri, header};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde::Deserialize;
use serde_json::json;
use sha2::{Digest as _, Sha256};
use tokio::sync::Mutex;

use super::reference::{Digest, Reference};
use super::{
    CONFIG_MEDIA_TYPES, LAYER_MEDIA_TYPES, MANIFEST_MEDIA_TYPES, OciError, SCRIPT_MAX_BYTES,
    STARLARK_LAYER_MEDIA_TYPE, layer_language, layer_media_type,
};
use crate::sandbox::Language;

type Https = hyper_rustls::HttpsConnector<HttpConnector>;

/// Redirects followed within the registry's origin before giving up.
const MAX_REDIRECTS: usize = 3;
/// What of an error answer's body is kept for the message.
const ERROR_BODY_BYTES: usize = 512;

/// How much a registry may send and how long it may take.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Largest manifest read.
    pub manifest_bytes: u64,
    /// Largest blob (module) read.
    pub blob_bytes: u64,
    /// Longest one exchange may take, body included.
    pub timeout: Duration,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            manifest_bytes: 4 << 20,
            blob_bytes: crate::config::MODULE_MAX_MIB << 20,
            timeout: Duration::from_secs(60),
        }
    }
}

/// Basic credentials for one registry.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    /// The user name.
    pub username: String,
    /// The password or token.
    pub password: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("username", &self.username)
            .finish_non_exhaustive()
    }
}

impl Credentials {
    /// The entry for `registry` in a Docker config (`.dockerconfigjson`): `auths.<registry>`
    /// with `auth` (base64 of `user:password`) or `username` and `password`. `None` when the
    /// config has no entry for it.
    pub fn from_docker_config(json: &[u8], registry: &str) -> Result<Option<Credentials>, String> {
        use base64::Engine as _;
        #[derive(Deserialize)]
        struct Config {
            #[serde(default)]
            auths: std::collections::BTreeMap<String, Entry>,
        }
        #[derive(Deserialize)]
        struct Entry {
            auth: Option<String>,
            username: Option<String>,
            password: Option<String>,
        }
        let config: Config =
            serde_json::from_slice(json).map_err(|e| format!("not a Docker config: {e}"))?;
        // Keys may be written with a scheme or a trailing path (`https://index.docker.io/v1/`).
        let entry = config.auths.into_iter().find_map(|(key, entry)| {
            let host = key
                .trim_start_matches("https://")
                .trim_start_matches("http://");
            let host = host.split('/').next().unwrap_or(host);
            (host == registry).then_some(entry)
        });
        let Some(entry) = entry else { return Ok(None) };
        if let (Some(username), Some(password)) = (entry.username, entry.password) {
            return Ok(Some(Credentials { username, password }));
        }
        let auth = entry
            .auth
            .ok_or_else(|| format!("the entry for {registry} has neither auth nor username"))?;
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(auth.trim())
            .map_err(|e| format!("the entry for {registry}: auth is not base64: {e}"))?;
        let text = String::from_utf8(decoded)
            .map_err(|_| format!("the entry for {registry}: auth is not UTF-8"))?;
        let (username, password) = text
            .split_once(':')
            .ok_or_else(|| format!("the entry for {registry}: auth is not user:password"))?;
        Ok(Some(Credentials {
            username: username.to_string(),
            password: password.to_string(),
        }))
    }

    fn basic(&self) -> String {
        use base64::Engine as _;
        let raw = format!("{}:{}", self.username, self.password);
        format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(raw)
        )
    }
}

/// A descriptor in a manifest.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Descriptor {
    /// What the blob is.
    pub media_type: String,
    /// Its digest, as the manifest says.
    pub digest: String,
    /// Its size, as the manifest says.
    pub size: u64,
    /// Its annotations (a cosign signature rides in one).
    #[serde(default)]
    pub annotations: std::collections::BTreeMap<String, String>,
}

/// An image manifest, as much of it as a plugin needs.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Manifest {
    /// Always 2.
    pub schema_version: u32,
    /// The config blob.
    pub config: Descriptor,
    /// The layers: a plugin has exactly one module among them.
    pub layers: Vec<Descriptor>,
}

/// A module pulled by digest.
#[derive(Debug, Clone)]
pub struct Pulled {
    /// The reference pinned to the manifest's digest.
    pub reference: Reference,
    /// The manifest's digest: what a revision records.
    pub manifest: Digest,
    /// The module layer's descriptor.
    pub layer: Descriptor,
    /// The module (or a script plugin's script: see [`Pulled::language`]).
    pub module: Vec<u8>,
}

impl Pulled {
    /// The language of a script plugin; `None` for a module.
    pub fn language(&self) -> Option<Language> {
        layer_language(&self.layer.media_type).flatten()
    }
}

/// A client of one registry.
pub struct OciClient {
    http: Client<Https, Full<Bytes>>,
    base: String,
    limits: Limits,
    credentials: Option<Credentials>,
    /// `Authorization` to send, once a challenge said which.
    authorization: Mutex<Option<HeaderValue>>,
}

impl std::fmt::Debug for OciClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OciClient")
            .field("base", &self.base)
            .finish()
    }
}

impl OciClient {
    /// A client for the registry of `reference`, with `credentials` if it asks for any.
    pub fn new(
        reference: &Reference,
        credentials: Option<Credentials>,
        limits: Limits,
    ) -> Result<OciClient, OciError> {
        let builder = hyper_rustls::HttpsConnectorBuilder::new();
        // An image without a CA bundle can still reach a registry on loopback.
        let builder = match builder.with_native_roots() {
            Ok(b) => b,
            Err(_) => hyper_rustls::HttpsConnectorBuilder::new().with_tls_config(
                rustls::ClientConfig::builder()
                    .with_root_certificates(rustls::RootCertStore::empty())
                    .with_no_client_auth(),
            ),
        };
        let connector = builder.https_or_http().enable_http1().build();
        Ok(OciClient {
            http: Client::builder(TokioExecutor::new()).build(connector),
            base: reference.base_url(),
            limits,
            credentials,
            authorization: Mutex::new(None),
        })
    }

    /// The manifest `reference` names, its bytes and digest. Pinned, the bytes must hash to
    /// the pin; by tag, a `Docker-Content-Digest` the registry sends must match them.
    pub async fn manifest(&self, reference: &Reference) -> Result<(Vec<u8>, Digest), OciError> {
        self.within(reference, self.manifest_unbounded(reference))
            .await
    }

    async fn manifest_unbounded(
        &self,
        reference: &Reference,
    ) -> Result<(Vec<u8>, Digest), OciError> {
        let url = format!(
            "{}/v2/{}/manifests/{}",
            self.base,
            reference.repository,
            reference.manifest_ref()
        );
        let mut headers = HeaderMap::new();
        headers.insert(
            header::ACCEPT,
            HeaderValue::from_static(
                "application/vnd.oci.image.manifest.v1+json, \
                 application/vnd.docker.distribution.manifest.v2+json",
            ),
        );
        let limit = self.limits.manifest_bytes;
        let (response, url) = self
            .send(Method::GET, &url, headers, Bytes::new(), false)
            .await?;
        let claimed = response
            .headers()
            .get("docker-content-digest")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let (bytes, digest) = self.read(response, &url, limit, "manifest").await?;
        let want = reference.digest.as_ref().map(Digest::to_string).or(claimed);
        if let Some(want) = want
            && want != digest.as_str()
        {
            return Err(OciError::DigestMismatch {
                what: format!("the manifest of {reference}"),
                expected: want,
                got: digest.to_string(),
            });
        }
        Ok((bytes, digest))
    }

    /// The one module `reference` holds: its manifest checked (the layout, the media types,
    /// sizes within the limits), then the module fetched and checked against its descriptor.
    pub async fn pull(&self, reference: &Reference) -> Result<Pulled, OciError> {
        let (manifest, layer, digest) = self.module_layer(reference).await?;
        let module = self.blob(reference, &digest, layer.size).await?;
        Ok(Pulled {
            reference: reference.pinned(manifest.clone()),
            manifest,
            layer,
            module,
        })
    }

    /// The manifest's digest and its module layer (descriptor and digest), checked as
    /// [`Self::pull`] checks them, before any of the module is fetched: a caller can reserve
    /// the layer's size first.
    pub async fn module_layer(
        &self,
        reference: &Reference,
    ) -> Result<(Digest, Descriptor, Digest), OciError> {
        let (bytes, manifest_digest) = self.manifest(reference).await?;
        let bad = |reason: String| OciError::Manifest {
            reference: reference.to_string(),
            reason,
        };
        let manifest: Manifest = serde_json::from_slice(&bytes)
            .map_err(|e| bad(format!("not an image manifest: {e}")))?;
        if manifest.schema_version != 2 {
            return Err(bad(format!(
                "schemaVersion {} (2 expected)",
                manifest.schema_version
            )));
        }
        if !CONFIG_MEDIA_TYPES.contains(&manifest.config.media_type.as_str()) {
            return Err(bad(format!(
                "config media type {:?} is not a wasm config ({})",
                manifest.config.media_type,
                CONFIG_MEDIA_TYPES.join(", ")
            )));
        }
        let modules: Vec<&Descriptor> = manifest
            .layers
            .iter()
            .filter(|l| layer_language(&l.media_type).is_some())
            .collect();
        let [layer] = modules[..] else {
            return Err(bad(format!(
                "{} layers of a plugin type ({}, {STARLARK_LAYER_MEDIA_TYPE}); a plugin has exactly one",
                modules.len(),
                LAYER_MEDIA_TYPES.join(", ")
            )));
        };
        let limit = match layer_language(&layer.media_type) {
            Some(Some(_)) => self.limits.blob_bytes.min(SCRIPT_MAX_BYTES),
            _ => self.limits.blob_bytes,
        };
        if layer.size > limit {
            return Err(OciError::TooLarge {
                what: format!("the plugin layer {} of {reference}", layer.digest),
                limit,
                size: Some(layer.size),
            });
        }
        let digest: Digest = layer
            .digest
            .parse()
            .map_err(|e| bad(format!("the plugin layer: {e}")))?;
        Ok((manifest_digest, layer.clone(), digest))
    }

    /// A blob of exactly `size` bytes (at most [`Limits::blob_bytes`]) whose digest is
    /// `digest`. A registry that sends blobs from elsewhere (object storage) is followed
    /// there over HTTPS, without its credentials: the digest vouches for what comes back.
    pub async fn blob(
        &self,
        reference: &Reference,
        digest: &Digest,
        size: u64,
    ) -> Result<Vec<u8>, OciError> {
        self.within(reference, self.blob_unbounded(reference, digest, size))
            .await
    }

    async fn blob_unbounded(
        &self,
        reference: &Reference,
        digest: &Digest,
        size: u64,
    ) -> Result<Vec<u8>, OciError> {
        if size > self.limits.blob_bytes {
            return Err(OciError::TooLarge {
                what: format!("blob {digest} of {reference}"),
                limit: self.limits.blob_bytes,
                size: Some(size),
            });
        }
        let url = format!("{}/v2/{}/blobs/{digest}", self.base, reference.repository);
        let (response, url) = self
            .send(Method::GET, &url, HeaderMap::new(), Bytes::new(), true)
            .await?;
        let what = format!("blob {digest}");
        let (bytes, got) = self.read(response, &url, size, &what).await?;
        if bytes.len() as u64 != size {
            return Err(OciError::Manifest {
                reference: reference.to_string(),
                reason: format!(
                    "{what} is {} bytes, its descriptor says {size}",
                    bytes.len()
                ),
            });
        }
        if &got != digest {
            return Err(OciError::DigestMismatch {
                what,
                expected: digest.to_string(),
                got: got.to_string(),
            });
        }
        Ok(bytes)
    }

    /// Pushes `module` as a one-layer wasm artifact (config
    /// `application/vnd.wasm.config.v0+json`, layer `application/wasm`) under the reference's
    /// tag, or by digest alone when it has none, and returns the manifest's digest. The same
    /// module always makes the same manifest: nothing in it is a time or a name.
    pub async fn push(&self, reference: &Reference, module: &[u8]) -> Result<Digest, OciError> {
        self.push_plugin(reference, None, module).await
    }

    /// [`Self::push`] for a plugin in `language` (a module for `None`): a script is the layer,
    /// of its language's media type ([`super::layer_media_type`]).
    pub async fn push_plugin(
        &self,
        reference: &Reference,
        language: Option<Language>,
        module: &[u8],
    ) -> Result<Digest, OciError> {
        self.within(reference, self.push_unbounded(reference, language, module))
            .await
    }

    async fn push_unbounded(
        &self,
        reference: &Reference,
        language: Option<Language>,
        module: &[u8],
    ) -> Result<Digest, OciError> {
        let config = serde_json::to_vec(&json!({
            "architecture": "wasm",
            "os": "wasip2",
            "layerDigests": [Digest::of(module).as_str()],
        }))
        .expect("JSON serialises");
        let layers = [(layer_media_type(language), Bytes::copy_from_slice(module))];
        self.push_image_unbounded(reference, CONFIG_MEDIA_TYPES[0], config, &layers)
            .await
    }

    /// Pushes an image manifest of `config` (of media type `config_type`) and `layers` (media
    /// type and bytes each) under the reference's tag, or by digest alone when it has none,
    /// and returns the manifest's digest.
    pub async fn push_image(
        &self,
        reference: &Reference,
        config_type: &str,
        config: Vec<u8>,
        layers: &[(&str, Bytes)],
    ) -> Result<Digest, OciError> {
        self.within(
            reference,
            self.push_image_unbounded(reference, config_type, config, layers),
        )
        .await
    }

    async fn push_image_unbounded(
        &self,
        reference: &Reference,
        config_type: &str,
        config: Vec<u8>,
        layers: &[(&str, Bytes)],
    ) -> Result<Digest, OciError> {
        let config_digest = Digest::of(&config);
        let size = config.len();
        self.upload(reference, &config_digest, Bytes::from(config))
            .await?;
        let mut descriptors = Vec::new();
        for (media_type, bytes) in layers {
            let digest = Digest::of(bytes);
            self.upload(reference, &digest, bytes.clone()).await?;
            descriptors.push(json!({
                "mediaType": media_type,
                "digest": digest.as_str(),
                "size": bytes.len(),
            }));
        }
        let manifest = serde_json::to_vec(&json!({
            "schemaVersion": 2,
            "mediaType": MANIFEST_MEDIA_TYPES[0],
            "config": {
                "mediaType": config_type,
                "digest": config_digest.as_str(),
                "size": size,
            },
            "layers": descriptors,
        }))
        .expect("JSON serialises");
        let digest = Digest::of(&manifest);
        let target = reference.tag.clone().unwrap_or_else(|| digest.to_string());
        self.put_manifest(reference, &target, manifest).await?;
        Ok(digest)
    }

    /// Stores `manifest` (an OCI image manifest) in the reference's repository under `target`,
    /// a tag or its digest, and checks the digest the registry says it stored.
    pub(super) async fn put_manifest(
        &self,
        reference: &Reference,
        target: &str,
        manifest: Vec<u8>,
    ) -> Result<(), OciError> {
        let digest = Digest::of(&manifest);
        let url = format!(
            "{}/v2/{}/manifests/{target}",
            self.base, reference.repository
        );
        let mut headers = HeaderMap::new();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static(MANIFEST_MEDIA_TYPES[0]),
        );
        let (response, url) = self
            .send(Method::PUT, &url, headers, Bytes::from(manifest), false)
            .await?;
        let stored = response
            .headers()
            .get("docker-content-digest")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        self.expect(response, &url, StatusCode::CREATED).await?;
        if let Some(stored) = stored
            && stored != digest.as_str()
        {
            return Err(OciError::DigestMismatch {
                what: format!("the manifest pushed to {url}"),
                expected: digest.to_string(),
                got: stored,
            });
        }
        Ok(())
    }

    /// One blob uploaded whole (a POST for the upload's place, then a PUT of the bytes), unless
    /// the registry has it already.
    pub(super) async fn upload(
        &self,
        reference: &Reference,
        digest: &Digest,
        bytes: Bytes,
    ) -> Result<(), OciError> {
        let repo = &reference.repository;
        let head = format!("{}/v2/{repo}/blobs/{digest}", self.base);
        let (response, _) = self
            .send(Method::HEAD, &head, HeaderMap::new(), Bytes::new(), true)
            .await?;
        if response.status() == StatusCode::OK {
            return Ok(());
        }
        let start = format!("{}/v2/{repo}/blobs/uploads/", self.base);
        let (response, url) = self
            .send(Method::POST, &start, HeaderMap::new(), Bytes::new(), false)
            .await?;
        let location = response
            .headers()
            .get(header::LOCATION)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        self.expect(response, &url, StatusCode::ACCEPTED).await?;
        let location = location.ok_or_else(|| OciError::Protocol {
            url: url.clone(),
            reason: "an upload was started without a Location".into(),
        })?;
        let place = self.same_origin(&url, &location)?;
        let sep = if place.contains('?') { '&' } else { '?' };
        let put = format!("{place}{sep}digest={digest}");
        let mut headers = HeaderMap::new();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/octet-stream"),
        );
        let (response, url) = self.send(Method::PUT, &put, headers, bytes, false).await?;
        self.expect(response, &url, StatusCode::CREATED).await
    }

    /// Sends a request, answering one authentication challenge and following redirects within
    /// the registry's origin (with `blob`, to any HTTPS origin too, from then on without
    /// credentials); returns the answer and the URL that gave it.
    async fn send(
        &self,
        method: Method,
        url: &str,
        headers: HeaderMap,
        body: Bytes,
        blob: bool,
    ) -> Result<(Response<Incoming>, String), OciError> {
        let mut url = url.to_string();
        let mut challenged = false;
        let mut redirects = 0;
        // Once elsewhere, nothing of the registry's credentials goes along.
        let mut elsewhere = false;
        loop {
            let mut request = Request::builder().method(method.clone()).uri(&url);
            for (name, value) in &headers {
                request = request.header(name, value);
            }
            if !elsewhere && let Some(auth) = self.authorization.lock().await.clone() {
                request = request.header(header::AUTHORIZATION, auth);
            }
            let request =
                request
                    .body(Full::new(body.clone()))
                    .map_err(|e| OciError::Protocol {
                        url: url.clone(),
                        reason: format!("not a request: {e}"),
                    })?;
            let response = self.exchange(request, &url).await?;
            let status = response.status();
            if status == StatusCode::UNAUTHORIZED && !challenged && !elsewhere {
                challenged = true;
                let challenge = response
                    .headers()
                    .get(header::WWW_AUTHENTICATE)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("")
                    .to_string();
                let auth = self.answer(&url, &challenge).await?;
                *self.authorization.lock().await = Some(auth);
                continue;
            }
            if status.is_redirection() {
                redirects += 1;
                let location = response
                    .headers()
                    .get(header::LOCATION)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("")
                    .to_string();
                if redirects > MAX_REDIRECTS {
                    return Err(OciError::Protocol {
                        url,
                        reason: format!("more than {MAX_REDIRECTS} redirects"),
                    });
                }
                url = match self.same_origin(&url, &location) {
                    Ok(next) => next,
                    Err(_) if blob && location.starts_with("https://") => {
                        elsewhere = true;
                        location
                    }
                    Err(e) => return Err(e),
                };
                continue;
            }
            return Ok((response, url));
        }
    }

    /// `work` within [`Limits::timeout`], all of its exchanges together.
    pub(super) async fn within<T, E: From<OciError>>(
        &self,
        reference: &Reference,
        work: impl Future<Output = Result<T, E>>,
    ) -> Result<T, E> {
        tokio::time::timeout(self.limits.timeout, work)
            .await
            .map_err(|_| {
                E::from(OciError::Timeout {
                    url: format!("{}/v2/{}", self.base, reference.repository),
                    after: self.limits.timeout,
                })
            })?
    }

    /// One request sent and its answer's head received, within the timeout.
    async fn exchange(
        &self,
        request: Request<Full<Bytes>>,
        url: &str,
    ) -> Result<Response<Incoming>, OciError> {
        tokio::time::timeout(self.limits.timeout, self.http.request(request))
            .await
            .map_err(|_| OciError::Timeout {
                url: url.to_string(),
                after: self.limits.timeout,
            })?
            .map_err(|e| OciError::Http {
                url: url.to_string(),
                source: Box::new(e),
            })
    }

    /// The `Authorization` that answers a `WWW-Authenticate` challenge.
    async fn answer(&self, url: &str, challenge: &str) -> Result<HeaderValue, OciError> {
        let refused = |reason: String| OciError::Auth {
            url: url.to_string(),
            reason,
        };
        let (scheme, params) = challenge.split_once(' ').unwrap_or((challenge, ""));
        if scheme.eq_ignore_ascii_case("basic") {
            let credentials = self.credentials.as_ref().ok_or_else(|| {
                refused("the registry asks for credentials and none were given".into())
            })?;
            let mut value = HeaderValue::from_str(&credentials.basic())
                .map_err(|_| refused("credentials are not a header value".into()))?;
            value.set_sensitive(true);
            return Ok(value);
        }
        if !scheme.eq_ignore_ascii_case("bearer") {
            return Err(refused(format!("unsupported challenge {challenge:?}")));
        }
        let params = challenge_params(params);
        let realm = params
            .iter()
            .find(|(k, _)| k == "realm")
            .map(|(_, v)| v.clone())
            .ok_or_else(|| refused("a Bearer challenge without a realm".into()))?;
        let realm_uri: Uri = realm
            .parse()
            .map_err(|_| refused(format!("realm {realm:?} is not a URL")))?;
        let loopback = realm_uri.host().is_some_and(|h| {
            h == "localhost"
                || h.trim_matches(['[', ']'])
                    .parse::<std::net::IpAddr>()
                    .is_ok_and(|ip| ip.is_loopback())
        });
        // Plain HTTP only from a registry on loopback to a token service on loopback.
        if realm_uri.scheme_str() != Some("https")
            && !(loopback && self.base.starts_with("http://"))
        {
            return Err(refused(format!(
                "realm {realm} is not HTTPS: credentials would travel in the clear"
            )));
        }
        let mut query = Vec::new();
        for (k, v) in &params {
            if k == "service" || k == "scope" {
                query.push(format!("{k}={}", percent(v)));
            }
        }
        let token_url = if query.is_empty() {
            realm.clone()
        } else {
            let sep = if realm.contains('?') { '&' } else { '?' };
            format!("{realm}{sep}{}", query.join("&"))
        };
        let mut request = Request::builder().method(Method::GET).uri(&token_url);
        if let Some(c) = &self.credentials {
            request = request.header(header::AUTHORIZATION, c.basic());
        }
        let request = request
            .body(Full::new(Bytes::new()))
            .map_err(|e| refused(format!("the token request: {e}")))?;
        let response = self.exchange(request, &token_url).await?;
        if !response.status().is_success() {
            return Err(refused(format!(
                "the token service {realm} answered {}",
                response.status()
            )));
        }
        let (body, _) = self.read(response, &token_url, 64 << 10, "token").await?;
        #[derive(Deserialize)]
        struct Token {
            token: Option<String>,
            access_token: Option<String>,
        }
        let token: Token = serde_json::from_slice(&body)
            .map_err(|e| refused(format!("the token service's answer: {e}")))?;
        let token = token
            .token
            .or(token.access_token)
            .ok_or_else(|| refused("the token service gave no token".into()))?;
        let mut value = HeaderValue::from_str(&format!("Bearer {token}"))
            .map_err(|_| refused("the token is not a header value".into()))?;
        value.set_sensitive(true);
        Ok(value)
    }

    /// `location` made absolute against `url`, if it stays in the registry's origin.
    fn same_origin(&self, url: &str, location: &str) -> Result<String, OciError> {
        let absolute = if location.starts_with('/') {
            format!("{}{location}", self.base)
        } else if location.contains("://") {
            location.to_string()
        } else {
            // Relative to the current URL's directory (RFC 3986, without dot segments).
            let path = url.split(['?', '#']).next().unwrap_or(url);
            let dir = path.rsplit_once('/').map_or(path, |(dir, _)| dir);
            format!("{dir}/{location}")
        };
        let origin = |u: &str| {
            u.parse::<Uri>()
                .ok()
                .and_then(|u| Some((u.scheme_str()?.to_string(), u.authority()?.to_string())))
        };
        if origin(&absolute).is_none() || origin(&absolute) != origin(&self.base) {
            return Err(OciError::Redirect {
                from: url.to_string(),
                to: location.to_string(),
            });
        }
        Ok(absolute)
    }

    /// Fails unless the answer has `status`, with what the registry said.
    async fn expect(
        &self,
        response: Response<Incoming>,
        url: &str,
        status: StatusCode,
    ) -> Result<(), OciError> {
        if response.status() == status {
            return Ok(());
        }
        Err(self.status_error(response, url).await)
    }

    async fn status_error(&self, response: Response<Incoming>, url: &str) -> OciError {
        let status = response.status();
        let body = match self
            .read_body(
                response.into_body(),
                url,
                ERROR_BODY_BYTES as u64,
                true,
                ERROR_BODY_BYTES as u64,
            )
            .await
        {
            // Printable only: the body is the registry's, and goes to logs and Events.
            Ok((b, _)) => String::from_utf8_lossy(&b)
                .trim()
                .chars()
                .map(|c| if c.is_control() { ' ' } else { c })
                .collect(),
            Err(_) => String::new(),
        };
        OciError::Status {
            url: url.to_string(),
            status: status.as_u16(),
            body,
        }
    }

    /// The body of a successful answer, at most `limit` bytes, and its digest.
    async fn read(
        &self,
        response: Response<Incoming>,
        url: &str,
        limit: u64,
        what: &str,
    ) -> Result<(Vec<u8>, Digest), OciError> {
        if !response.status().is_success() {
            return Err(self.status_error(response, url).await);
        }
        let length = response
            .headers()
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        if let Some(length) = length
            && length > limit
        {
            return Err(OciError::TooLarge {
                what: format!("{what} at {url}"),
                limit,
                size: Some(length),
            });
        }
        // Taken once, at the size the answer declares (or its limit), never doubled past it.
        let reserve = length.unwrap_or(limit).min(limit);
        self.read_body(response.into_body(), url, limit, false, reserve)
            .await
            .map_err(|e| match e {
                OciError::TooLarge { limit, .. } => OciError::TooLarge {
                    what: format!("{what} at {url}"),
                    limit,
                    size: None,
                },
                e => e,
            })
    }

    /// Reads a body within the timeout; past `limit` bytes it stops with `TooLarge`, or, with
    /// `truncate`, keeps the first `limit`.
    async fn read_body(
        &self,
        mut body: Incoming,
        url: &str,
        limit: u64,
        truncate: bool,
        reserve: u64,
    ) -> Result<(Vec<u8>, Digest), OciError> {
        let read = async {
            let mut bytes = Vec::new();
            bytes
                .try_reserve_exact(reserve as usize)
                .map_err(|_| OciError::TooLarge {
                    what: url.to_string(),
                    limit: reserve,
                    size: None,
                })?;
            let mut hasher = Sha256::new();
            while let Some(frame) = body.frame().await {
                let frame = frame.map_err(|e| OciError::Http {
                    url: url.to_string(),
                    source: Box::new(e),
                })?;
                let Ok(data) = frame.into_data() else {
                    continue;
                };
                if (bytes.len() + data.len()) as u64 > limit {
                    if truncate {
                        let room = limit as usize - bytes.len();
                        bytes.extend_from_slice(&data[..room]);
                        break;
                    }
                    return Err(OciError::TooLarge {
                        what: url.to_string(),
                        limit,
                        size: None,
                    });
                }
                hasher.update(&data);
                bytes.extend_from_slice(&data);
            }
            Ok((bytes, Digest::from_hasher(hasher)))
        };
        tokio::time::timeout(self.limits.timeout, read)
            .await
            .map_err(|_| OciError::Timeout {
                url: url.to_string(),
                after: self.limits.timeout,
            })?
    }
}

/// `key="value", key2="value2"` of a challenge.
fn challenge_params(text: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut rest = text.trim();
    while let Some((key, after)) = rest.split_once('=') {
        let key = key
            .trim()
            .trim_start_matches(',')
            .trim()
            .to_ascii_lowercase();
        let after = after.trim_start();
        let (value, next) = if let Some(quoted) = after.strip_prefix('"') {
            match quoted.split_once('"') {
                Some((v, n)) => (v, n),
                None => (quoted, ""),
            }
        } else {
            match after.split_once(',') {
                Some((v, n)) => (v.trim(), n),
                None => (after.trim(), ""),
            }
        };
        out.push((key, value.to_string()));
        rest = next.trim_start().trim_start_matches(',');
    }
    out
}

/// Percent-encodes what is not unreserved (RFC 3986).
fn percent(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_challenge_gives_its_parameters() {
        let p = challenge_params(
            r#"realm="https://auth.example/token",service="registry.example",scope="repository:a/b:pull""#,
        );
        assert_eq!(
            p,
            vec![
                ("realm".into(), "https://auth.example/token".into()),
                ("service".into(), "registry.example".into()),
                ("scope".into(), "repository:a/b:pull".into()),
            ]
        );
        assert_eq!(percent("repository:a/b:pull"), "repository%3Aa%2Fb%3Apull");
    }

    #[test]
    fn credentials_come_from_a_docker_config() {
        let json = br#"{"auths":{"https://r.example/v1/":{"auth":"dXNlcjpwYTpzcw=="},
                        "other.example":{"username":"u","password":"p"}}}"#;
        let c = Credentials::from_docker_config(json, "r.example")
            .unwrap()
            .unwrap();
        assert_eq!(
            (c.username.as_str(), c.password.as_str()),
            ("user", "pa:ss")
        );
        let c = Credentials::from_docker_config(json, "other.example")
            .unwrap()
            .unwrap();
        assert_eq!((c.username.as_str(), c.password.as_str()), ("u", "p"));
        assert_eq!(
            Credentials::from_docker_config(json, "none.example").unwrap(),
            None
        );
        assert!(Credentials::from_docker_config(br#"{"auths": 3}"#, "r.example").is_err());
        // A password never reaches a log line through Debug.
        assert!(!format!("{c:?}").contains("\"p\""));
    }
}
