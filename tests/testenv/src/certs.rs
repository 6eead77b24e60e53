//! The plane's PKI and its admin kubeconfig.
//!
//! One throwaway CA signs the apiserver's serving certificate (for `127.0.0.1` and
//! `localhost`) and the admin client certificate (`CN=admin`, `O=system:masters`, so RBAC
//! lets it do anything). rcgen writes X.509 **v3** certificates: rustls, under kube-rs,
//! rejects v1 client certificates that kubectl would accept. Keys are ECDSA P-256, which
//! the apiserver accepts for TLS and for signing service-account tokens (ES256).

use std::fs;
use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};

use base64::Engine as _;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};

use crate::error::{Error, Result};

/// Paths of the files written by [`generate`], for component flags.
#[derive(Debug, Clone)]
pub(crate) struct Pki {
    /// The CA certificate (client CA of the apiserver, root CA handed to pods).
    pub ca_cert: PathBuf,
    /// The CA key (lets the controller-manager sign CSRs).
    pub ca_key: PathBuf,
    /// The apiserver's serving certificate and key.
    pub serving_cert: PathBuf,
    pub serving_key: PathBuf,
    /// The service-account token signing key, and its public half.
    pub sa_key: PathBuf,
    pub sa_pub: PathBuf,
    /// PEM of the CA certificate, the admin certificate and its key, for kubeconfigs.
    ca_pem: String,
    admin_cert_pem: String,
    admin_key_pem: String,
}

/// Generates the CA, certificates and keys into `dir`.
pub(crate) fn generate(dir: &Path) -> Result<Pki> {
    let ca_key = KeyPair::generate()?;
    let mut ca_params = CertificateParams::default();
    ca_params.distinguished_name = name("wasmop-testenv-ca", None);
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca_cert = ca_params.self_signed(&ca_key)?;
    let ca = Issuer::new(ca_params, &ca_key);

    let serving_key = KeyPair::generate()?;
    let mut serving = CertificateParams::new(vec!["localhost".to_owned()])?;
    serving
        .subject_alt_names
        .push(SanType::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST)));
    serving.distinguished_name = name("kube-apiserver", None);
    serving.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    serving.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let serving_cert = serving.signed_by(&serving_key, &ca)?;

    let admin_key = KeyPair::generate()?;
    let mut admin = CertificateParams::default();
    admin.distinguished_name = name("admin", Some("system:masters"));
    admin.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    admin.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    let admin_cert = admin.signed_by(&admin_key, &ca)?;

    let sa_key = KeyPair::generate()?;

    let pki = Pki {
        ca_cert: dir.join("ca.crt"),
        ca_key: dir.join("ca.key"),
        serving_cert: dir.join("apiserver.crt"),
        serving_key: dir.join("apiserver.key"),
        sa_key: dir.join("sa.key"),
        sa_pub: dir.join("sa.pub"),
        ca_pem: ca_cert.pem(),
        admin_cert_pem: admin_cert.pem(),
        admin_key_pem: admin_key.serialize_pem(),
    };
    for (path, pem) in [
        (&pki.ca_cert, pki.ca_pem.clone()),
        (&pki.ca_key, ca_key.serialize_pem()),
        (&pki.serving_cert, serving_cert.pem()),
        (&pki.serving_key, serving_key.serialize_pem()),
        (&pki.sa_key, sa_key.serialize_pem()),
        (&pki.sa_pub, sa_key.public_key_pem()),
    ] {
        fs::write(path, pem).map_err(|e| Error::io(format!("writing {}", path.display()), e))?;
    }
    Ok(pki)
}

impl Pki {
    /// A kubeconfig for the admin user against `server`, with all credentials inline so the
    /// file can be copied anywhere.
    pub(crate) fn admin_kubeconfig(&self, server: &str) -> String {
        let b64 = |pem: &str| base64::engine::general_purpose::STANDARD.encode(pem);
        format!(
            "apiVersion: v1
kind: Config
clusters:
- name: testenv
  cluster:
    server: {server}
    certificate-authority-data: {ca}
users:
- name: admin
  user:
    client-certificate-data: {cert}
    client-key-data: {key}
contexts:
- name: testenv
  context:
    cluster: testenv
    user: admin
current-context: testenv
",
            ca = b64(&self.ca_pem),
            cert = b64(&self.admin_cert_pem),
            key = b64(&self.admin_key_pem),
        )
    }
}

fn name(common_name: &str, organization: Option<&str>) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    if let Some(org) = organization {
        dn.push(DnType::OrganizationName, org);
    }
    dn.push(DnType::CommonName, common_name);
    dn
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_files_and_a_parseable_kubeconfig() {
        let dir = std::env::temp_dir().join(format!("testenv-pki-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let pki = generate(&dir).unwrap();
        for path in [&pki.ca_cert, &pki.serving_cert, &pki.sa_key, &pki.sa_pub] {
            assert!(fs::read_to_string(path).unwrap().starts_with("-----BEGIN "));
        }
        let kubeconfig = pki.admin_kubeconfig("https://127.0.0.1:6443");
        let parsed = kube::config::Kubeconfig::from_yaml(&kubeconfig).unwrap();
        assert_eq!(parsed.current_context.as_deref(), Some("testenv"));
        fs::remove_dir_all(dir).unwrap();
    }
}
