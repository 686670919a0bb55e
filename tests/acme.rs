//! ACME against a real ACME server: Pebble (Debian `pebble`), with
//! `pebble-challtestsrv` as its DNS pointing every name at 127.0.0.1, so
//! Pebble validates each HTTP-01 challenge by fetching it from shardgate's
//! plain listener — validation is never switched off.

mod common;

use common::*;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;
use tokio_rustls::rustls;

/// A child process killed when dropped.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Pebble and its DNS; `ca_pem` is the file to trust for Pebble's API.
struct Pebble {
    _dns: Proc,
    _pebble: Proc,
    directory: String,
    ca_pem: std::path::PathBuf,
}

impl Pebble {
    /// Pebble validating HTTP-01 on `http_port`, issuing certificates valid
    /// for `validity_secs`, refusing `blocked` names.
    fn start(
        dir: &std::path::Path,
        http_port: u16,
        validity_secs: u64,
        blocked: &[&str],
    ) -> Pebble {
        // Pebble's own HTTPS certificate, from a CA of ours.
        let ca_key = rcgen::KeyPair::generate().expect("key");
        let mut params = rcgen::CertificateParams::new(Vec::new()).expect("params");
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca = params.self_signed(&ca_key).expect("ca");
        let key = rcgen::KeyPair::generate().expect("key");
        let leaf =
            rcgen::CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()])
                .expect("params")
                .signed_by(&key, &ca, &ca_key)
                .expect("leaf");
        let ca_pem = dir.join("pebble-ca.pem");
        std::fs::write(&ca_pem, ca.pem()).expect("write");
        std::fs::write(dir.join("pebble.crt"), leaf.pem()).expect("write");
        std::fs::write(dir.join("pebble.key"), key.serialize_pem()).expect("write");
        let (dns_port, api_port, mgmt_port, dns_mgmt) =
            (free_port(), free_port(), free_port(), free_port());
        let dns = Proc(
            Command::new("pebble-challtestsrv")
                .args(["-defaultIPv4", "127.0.0.1", "-defaultIPv6", ""])
                .args(["-dns01", &format!("127.0.0.1:{dns_port}")])
                .args(["-http01", "", "-https01", "", "-tlsalpn01", ""])
                .args(["-management", &format!("127.0.0.1:{dns_mgmt}")])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("pebble-challtestsrv (Debian `pebble`, installed by scripts/prereqs.sh)"),
        );
        let config = serde_json::json!({
            "pebble": {
                "listenAddress": format!("127.0.0.1:{api_port}"),
                "managementListenAddress": format!("127.0.0.1:{mgmt_port}"),
                "certificate": dir.join("pebble.crt"),
                "privateKey": dir.join("pebble.key"),
                "httpPort": http_port,
                "tlsPort": free_port(),
                "ocspResponderURL": "",
                "externalAccountBindingRequired": false,
                "domainBlocklist": blocked,
                "certificateValidityPeriod": validity_secs,
            }
        });
        let config_path = dir.join("pebble.json");
        std::fs::write(&config_path, config.to_string()).expect("write");
        let pebble = Proc(
            Command::new("pebble")
                .arg("-config")
                .arg(&config_path)
                .args(["-dnsserver", &format!("127.0.0.1:{dns_port}")])
                .env("PEBBLE_VA_NOSLEEP", "1")
                .env("PEBBLE_WFE_NONCEREJECT", "0")
                .stdout(std::fs::File::create(dir.join("pebble.log")).expect("log"))
                .stderr(Stdio::inherit())
                .spawn()
                .expect("pebble (Debian `pebble`, installed by scripts/prereqs.sh)"),
        );
        assert!(
            eventually(Duration::from_secs(10), || std::net::TcpStream::connect((
                "127.0.0.1",
                api_port
            ))
            .is_ok()),
            "pebble did not listen"
        );
        Pebble {
            _dns: dns,
            _pebble: pebble,
            directory: format!("https://127.0.0.1:{api_port}/dir"),
            ca_pem,
        }
    }
}

/// The issuer's common name of the certificate served for `sni`.
fn issuer_for(port: u16, sni: &str) -> Option<String> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let client = rustls::ClientConfig::builder()
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AnyCert))
        .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(client));
    let name = rustls::pki_types::ServerName::try_from(sni.to_string()).ok()?;
    let leaf = runtime().block_on(async move {
        let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .ok()?;
        let tls = connector.connect(name, tcp).await.ok()?;
        tls.get_ref()
            .1
            .peer_certificates()?
            .first()
            .map(|c| c.to_vec())
    })?;
    use x509_parser::prelude::*;
    let (_, cert) = X509Certificate::from_der(&leaf).ok()?;
    let cn = cert
        .issuer()
        .iter_common_name()
        .next()?
        .as_str()
        .ok()?
        .to_string();
    Some(cn)
}

fn acme_counter(gw: &Gateway, result: &str) -> u64 {
    metric_value(
        &metrics_text(gw.admin_port),
        &format!("shardgate_acme_orders_total{{result=\"{result}\"}}"),
    )
}

#[test]
fn acme_orders_validates_serves_and_renews_certificates_for_served_hosts_only() {
    let scratch = tempfile::tempdir().expect("dir");
    let plain = free_port();
    let pebble = Pebble::start(scratch.path(), plain, 24, &["blocked.example.com"]);
    // A platform certificate from a file, and one that covers a tenant
    // domain already (ACME must leave that one alone).
    let certs = scratch.path().join("certs");
    std::fs::create_dir(&certs).expect("dir");
    for (name, san) in [
        ("platform", "platform.test"),
        ("files", "files.example.com"),
    ] {
        let c = rcgen::generate_simple_self_signed(vec![san.to_string()]).expect("cert");
        std::fs::write(certs.join(format!("{name}.crt")), c.cert.pem()).expect("write");
        std::fs::write(
            certs.join(format!("{name}.key")),
            c.key_pair.serialize_pem(),
        )
        .expect("write");
    }
    let backend = Backend::start("a");
    let yaml = config_yaml(
        &format!(
            "listen:\n  - {{ addr: \"127.0.0.1:{{port}}\", tls: true }}\n  - {{ addr: \"127.0.0.1:{plain}\", redirect_https: true }}\nadmin: {{ addr: \"127.0.0.1:{{admin}}\" }}\nstate: false\ntls:\n  certs: \"{}\"\n  default_cert: platform\n  acme:\n    directory: \"{}\"\n    email: ops@example.com\n    storage: \"{{dir}}/acme\"\n    ca_file: \"{}\"\n",
            certs.display(),
            pebble.directory,
            pebble.ca_pem.display()
        ),
        &[("a", backend.url())],
        "domains:\n  map:\n    shop.example.com: shop\n    blocked.example.com: blocked\n    files.example.com: files\n    \"*.example.org\": org\n",
    );
    let gw = Gateway::start(&yaml);
    let certs_now = || gw.admin("GET", "/v1/certs", None, None).json();
    let acme_cert = |host: &str| {
        certs_now()["certs"].as_array().and_then(|all| {
            all.iter()
                .find(|c| c["name"] == host && c["source"] == "acme")
                .cloned()
        })
    };
    assert!(
        eventually(Duration::from_secs(60), || acme_cert("shop.example.com")
            .is_some()),
        "no certificate for shop.example.com: {}\n{}",
        certs_now(),
        gw.log()
    );
    let issued = acme_cert("shop.example.com").expect("issued");
    assert_eq!(issued["sans"], serde_json::json!(["shop.example.com"]));
    let issuer = issuer_for(gw.port, "shop.example.com").expect("handshake");
    assert!(issuer.starts_with("Pebble Intermediate CA"), "{issuer}");
    assert_eq!(
        issuer_for(gw.port, "files.example.com").as_deref(),
        Some("rcgen self signed cert")
    );
    // The refused order is visible, with its error, and backs off.
    assert!(eventually(Duration::from_secs(30), || {
        certs_now()["acme"]["hosts"]["blocked.example.com"]["state"] == "failed"
    }));
    let view = certs_now();
    let blocked = &view["acme"]["hosts"]["blocked.example.com"];
    assert!(
        blocked["last_error"]
            .as_str()
            .is_some_and(|e| !e.is_empty()),
        "{view}"
    );
    assert!(blocked["retry_at"].as_u64().is_some(), "{view}");
    assert!(acme_counter(&gw, "failed") >= 1);
    // Only hosts the gateway serves, exactly, and that no file covers.
    let hosts = view["acme"]["hosts"]
        .as_object()
        .cloned()
        .unwrap_or_default();
    let mut names: Vec<&String> = hosts.keys().collect();
    names.sort();
    assert_eq!(names, ["blocked.example.com", "shop.example.com"], "{view}");
    // A domain added through the admin API gets one too.
    let r = gw.admin(
        "PUT",
        "/v1/domains/new.example.com",
        Some("{\"tenant\":\"new\"}"),
        None,
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(
        eventually(Duration::from_secs(30), || acme_cert("new.example.com")
            .is_some()),
        "{}",
        certs_now()
    );
    // Renewed at two thirds of its 24 s life (16 s), served at once.
    let first = issued["not_before"].as_i64().unwrap_or(0);
    assert!(
        eventually(Duration::from_secs(40), || {
            acme_cert("shop.example.com")
                .and_then(|c| c["not_before"].as_i64())
                .is_some_and(|t| t > first)
        }),
        "not renewed: {}",
        certs_now()
    );
    assert!(acme_counter(&gw, "issued") >= 3);
    // The plain listener still redirects everything else.
    let r = send_raw(
        plain,
        b"GET / HTTP/1.1\r\nHost: shop.example.com\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(r.status, 308);
}

/// Cluster mode: three nodes on one Redis. Only `b` and `c` can reach the
/// ACME server, and Pebble validates through `a`'s plain listener only, so
/// every certificate is ordered by `b` or `c`, validated by `a` answering a
/// challenge it never published, and served by `a` without ordering it.
#[test]
fn in_a_cluster_one_node_orders_each_certificate_and_every_node_serves_it() {
    let scratch = tempfile::tempdir().expect("dir");
    let redis = Redis::start();
    let plain_a = free_port();
    let pebble = Pebble::start(scratch.path(), plain_a, 3600, &["blocked.example.com"]);
    let backend = Backend::start("a");
    // The nodes share private keys through Redis, sealed with this.
    let secret = scratch.path().join("cluster-secret");
    std::fs::write(&secret, "a secret of more than thirty-two bytes, shared\n").expect("secret");
    let node = |id: &str, plain: u16, directory: &str| {
        Gateway::start(&config_yaml(
            &format!(
                "listen:\n  - {{ addr: \"127.0.0.1:{{port}}\", tls: true }}\n  - {{ addr: \"127.0.0.1:{plain}\", redirect_https: true }}\nadmin: {{ addr: \"127.0.0.1:{{admin}}\" }}\nstate: false\ncluster: {{ redis: \"{}\", node_id: {id}, key_prefix: \"acme{}:\", secret_file: \"{}\" }}\ntls:\n  acme:\n    directory: \"{directory}\"\n    storage: \"{{dir}}/acme\"\n    ca_file: \"{}\"\n",
                redis.url(),
                std::process::id(),
                secret.display(),
                pebble.ca_pem.display()
            ),
            &[("a", backend.url())],
            "domains:\n  map:\n    shop.example.com: shop\n    blog.example.com: blog\n    blocked.example.com: blocked\n",
        ))
    };
    // `a`'s directory is a port nobody listens on: it can never order.
    let a = node("gw-a", plain_a, "https://127.0.0.1:9/dir");
    let b = node("gw-b", free_port(), &pebble.directory);
    let c = node("gw-c", free_port(), &pebble.directory);
    let hosts = ["shop.example.com", "blog.example.com"];
    for gw in [&a, &b, &c] {
        for host in hosts {
            assert!(
                eventually(Duration::from_secs(60), || issuer_for(gw.port, host)
                    .is_some_and(|i| i.starts_with("Pebble Intermediate CA"))),
                "{host} not served by Pebble's certificate on {}: {}\n{}",
                gw.port,
                gw.admin("GET", "/v1/certs", None, None).text(),
                gw.log()
            );
        }
    }
    // The blocked name fails once, and its backoff holds for both nodes
    // that could order it.
    for gw in [&b, &c] {
        assert!(
            eventually(Duration::from_secs(30), || {
                gw.admin("GET", "/v1/certs", None, None).json()["acme"]["hosts"]
                    ["blocked.example.com"]["state"]
                    == "failed"
            }),
            "{}",
            gw.admin("GET", "/v1/certs", None, None).text()
        );
    }
    // No private key in Redis in the clear.
    let prefix = format!("acme{}:acme:", std::process::id());
    for host in hosts {
        let out = Command::new("redis-cli")
            .args(["-p", &redis.port.to_string(), "HGET"])
            .arg(format!("{prefix}cert:{{{host}}}"))
            .arg("key")
            .output()
            .expect("redis-cli");
        let stored = String::from_utf8_lossy(&out.stdout).to_string();
        assert!(
            stored.starts_with("sealed:v1:"),
            "{host}'s key in Redis: {stored:.40}"
        );
        assert!(!stored.contains("PRIVATE KEY"));
    }
    std::thread::sleep(Duration::from_secs(3));
    let total = |result: &str| acme_counter(&b, result) + acme_counter(&c, result);
    assert_eq!(total("issued"), hosts.len() as u64, "one order per host");
    assert_eq!(total("failed"), 1, "the backoff is shared");
    assert_eq!(acme_counter(&a, "issued") + acme_counter(&a, "failed"), 0);
    // An entry in Redis naming a path, or a certificate for other names
    // than its host, is never installed.
    let stray =
        rcgen::generate_simple_self_signed(vec!["other.example.net".to_string()]).expect("cert");
    for host in ["../../escape", "stray.example.com"] {
        let redis_cli = |args: &[&str]| {
            let status = Command::new("redis-cli")
                .args(["-p", &redis.port.to_string()])
                .args(args)
                .stdout(Stdio::null())
                .status()
                .expect("redis-cli");
            assert!(status.success());
        };
        let (crt, key) = (stray.cert.pem(), stray.key_pair.serialize_pem());
        let cert_key = format!("{prefix}cert:{{{host}}}");
        redis_cli(&["HSET", &cert_key, "crt", &crt, "key", &key]);
        redis_cli(&["HSET", &format!("{prefix}certs"), host, "x:1"]);
        redis_cli(&["INCR", &format!("{prefix}certs:v")]);
    }
    std::thread::sleep(Duration::from_secs(3));
    for gw in [&a, &b, &c] {
        let storage = gw.dir.path().join("acme");
        assert!(!gw.dir.path().join("escape.crt").exists());
        assert!(!storage.join("escape.crt").exists());
        assert!(!storage.join("certs").join("stray.example.com.crt").exists());
    }
    // `a` installed what it got under its own storage, as served by it.
    let listed = a.admin("GET", "/v1/certs", None, None).json();
    for host in hosts {
        assert!(
            listed["certs"].as_array().is_some_and(|all| all
                .iter()
                .any(|cert| cert["name"] == host && cert["source"] == "acme")),
            "{listed}"
        );
    }
}
