//! The operator's page (`GET /` on the admin listener) in a real browser:
//! headless Chromium driven by ChromeDriver over WebDriver (W3C), against
//! the real binary and real shards. `scripts/prereqs.sh` installs Debian's
//! `chromium` and `chromium-driver`; without them this test fails (set
//! `SHARDGATE_SKIP_BROWSER=1` to skip it knowingly). A screenshot of the
//! page under load is left in `target/page-under-load.png`.

mod common;

use common::{config_yaml, eventually, free_port, Backend, Gateway};
use serde_json::{json, Value};
use std::io::Write;
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const TOKEN: &str = "page-test-token-16b";

/// A ChromeDriver process and one browser session in it.
struct Browser {
    driver: Child,
    port: u16,
    session: String,
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.call("DELETE", "", None);
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

/// One HTTP/1.1 exchange with ChromeDriver: the status and the JSON body
/// (read by its framing: ChromeDriver keeps the connection open).
fn http_json(
    port: u16,
    method: &str,
    path: &str,
    body: Option<&Value>,
) -> Result<(u16, Value), String> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).map_err(|e| e.to_string())?;
    stream.set_read_timeout(Some(Duration::from_secs(60))).ok();
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    let raw = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream
        .write_all(raw.as_bytes())
        .map_err(|e| e.to_string())?;
    let answer =
        common::read_response(&mut std::io::BufReader::new(stream)).map_err(|e| e.to_string())?;
    let value =
        serde_json::from_slice(&answer.body).map_err(|e| format!("{e}: {}", answer.text()))?;
    Ok((answer.status, value))
}

impl Browser {
    fn start() -> Option<Browser> {
        if std::env::var("SHARDGATE_SKIP_BROWSER").as_deref() == Ok("1") {
            return None;
        }
        let chromium = ["/usr/bin/chromium", "/usr/bin/chromium-browser", "/usr/bin/google-chrome"]
            .into_iter()
            .find(|p| std::path::Path::new(p).exists())
            .expect("chromium is needed for this test (apt-get install chromium chromium-driver; scripts/prereqs.sh does)");
        let port = free_port();
        let driver = Command::new("chromedriver")
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromedriver is needed for this test (apt-get install chromium-driver)");
        let ready = eventually(Duration::from_secs(20), || {
            http_json(port, "GET", "/status", None).is_ok_and(|(_, v)| v["value"]["ready"] == true)
        });
        let mut browser = Browser {
            driver,
            port,
            session: String::new(),
        };
        assert!(ready, "chromedriver did not come up");
        let caps = json!({ "capabilities": { "alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": chromium,
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                         "--window-size=1280,1100", "--no-first-run", "--disable-extensions"],
            },
            "goog:loggingPrefs": { "browser": "ALL" },
        }}});
        let (status, v) = http_json(port, "POST", "/session", Some(&caps)).expect("new session");
        assert_eq!(status, 200, "new session: {v}");
        browser.session = v["value"]["sessionId"]
            .as_str()
            .expect("session id")
            .to_string();
        Some(browser)
    }

    fn call(&self, method: &str, path: &str, body: Option<Value>) -> Result<Value, String> {
        let url = format!("/session/{}{path}", self.session);
        let (status, v) = http_json(self.port, method, &url, body.as_ref())?;
        if status != 200 {
            return Err(format!("{method} {path}: {status} {v}"));
        }
        Ok(v["value"].clone())
    }

    fn goto(&self, url: &str) {
        self.call("POST", "/url", Some(json!({ "url": url })))
            .expect("navigate");
    }

    /// Runs `script` (a function body; `arguments` are `args`) in the page.
    fn js(&self, script: &str, args: Value) -> Value {
        self.call(
            "POST",
            "/execute/sync",
            Some(json!({ "script": script, "args": args })),
        )
        .unwrap_or_else(|e| panic!("script failed: {e}"))
    }

    fn element(&self, css: &str) -> Option<String> {
        let v = self
            .call(
                "POST",
                "/element",
                Some(json!({ "using": "css selector", "value": css })),
            )
            .ok()?;
        v.as_object()?.values().next()?.as_str().map(str::to_string)
    }

    fn click(&self, css: &str) {
        let id = self
            .element(css)
            .unwrap_or_else(|| panic!("no element {css}"));
        self.call("POST", &format!("/element/{id}/click"), Some(json!({})))
            .unwrap_or_else(|e| panic!("click {css}: {e}"));
    }

    fn type_into(&self, css: &str, text: &str) {
        let id = self
            .element(css)
            .unwrap_or_else(|| panic!("no element {css}"));
        self.call(
            "POST",
            &format!("/element/{id}/value"),
            Some(json!({ "text": text })),
        )
        .unwrap_or_else(|e| panic!("type into {css}: {e}"));
    }

    /// Whether `css` matches a visible element.
    fn visible(&self, css: &str) -> bool {
        self.js(
            "const e = document.querySelector(arguments[0]); \
             return !!e && !!(e.offsetWidth || e.offsetHeight || e.getClientRects().length);",
            json!([css]),
        ) == json!(true)
    }

    /// Waits until `script` returns true.
    fn until(&self, within: Duration, script: &str, args: Value) -> bool {
        eventually(within, || self.js(script, args.clone()) == json!(true))
    }

    /// Waits up to `secs` until `script` returns true, else fails with `what`.
    fn expect(&self, secs: u64, script: &str, args: Value, what: &str) {
        assert!(
            self.until(Duration::from_secs(secs), script, args),
            "{what}"
        );
    }

    /// The browser's console and network errors so far (ChromeDriver's log).
    fn severe_logs(&self) -> Vec<String> {
        let logs = self
            .call("POST", "/se/log", Some(json!({ "type": "browser" })))
            .expect("browser log (goog:loggingPrefs)");
        logs.as_array()
            .into_iter()
            .flatten()
            .filter(|e| e["level"] == "SEVERE")
            .map(|e| e["message"].as_str().unwrap_or_default().to_string())
            .collect()
    }

    fn screenshot(&self, path: &std::path::Path) {
        let b64 = self.call("GET", "/screenshot", None).expect("screenshot");
        let png = base64_decode(b64.as_str().unwrap_or_default());
        assert!(png.starts_with(b"\x89PNG"), "not a PNG");
        std::fs::write(path, png).expect("write screenshot");
    }
}

/// Waits for the page's confirmation dialog and confirms.
fn confirm(browser: &Browser) {
    assert!(browser.until(
        Duration::from_secs(5),
        "return document.querySelector('#confirm').open;",
        json!([])
    ));
    browser.click("#confirm-ok");
}

fn base64_decode(s: &str) -> Vec<u8> {
    let value = |c: u8| match c {
        b'A'..=b'Z' => Some(c - b'A'),
        b'a'..=b'z' => Some(c - b'a' + 26),
        b'0'..=b'9' => Some(c - b'0' + 52),
        b'+' => Some(62),
        b'/' => Some(63),
        _ => None,
    };
    let sextets: Vec<u8> = s.bytes().filter_map(value).collect();
    sextets
        .chunks(4)
        .flat_map(|c| {
            let n = c.iter().fold(0u32, |acc, &v| acc << 6 | u32::from(v)) << (6 * (4 - c.len()));
            let bytes = n.to_be_bytes();
            bytes[1..c.len()].to_vec()
        })
        .collect()
}

#[test]
fn the_operators_page_shows_and_steers_a_live_gateway() {
    let Some(browser) = Browser::start() else {
        eprintln!("skipped: SHARDGATE_SKIP_BROWSER=1");
        return;
    };
    let shards = [
        Backend::start("a"),
        Backend::start("b"),
        Backend::start("c"),
    ];
    std::env::set_var("SHARDGATE_PAGE_TOKEN", TOKEN);
    let gw = Gateway::start(&config_yaml(
        "listen: [{ addr: \"127.0.0.1:{port}\" }]\n\
         admin: { addr: \"127.0.0.1:{admin}\", token_env: SHARDGATE_PAGE_TOKEN }\nstate: false\n",
        &[
            ("a", shards[0].url()),
            ("b", shards[1].url()),
            ("c", shards[2].url()),
        ],
        "health: { interval_ms: 200, timeout_ms: 200, fall: 2, rise: 1 }\n\
         limits: { rate: { tokens: 5, refill_per_second: 1 } }\n\
         plans: { free: {}, pro: { rate: null } }\ndefault_plan: free\n",
    ));
    let page = format!("http://127.0.0.1:{}/", gw.admin_port);

    // It asks for the token, and refuses a wrong one.
    browser.goto(&page);
    assert!(
        eventually(Duration::from_secs(10), || browser.visible("#login")),
        "the page did not ask for the token"
    );
    assert!(!browser.visible("#dashboard"));
    browser.type_into("#token", "not-the-token");
    browser.click("#login button[type=submit]");
    browser.expect(5, "const e = document.querySelector('#login-error'); return !e.hidden && e.textContent.includes('not accepted');", json!([]), "a wrong token is not refused");
    assert!(!browser.visible("#dashboard"));
    // The browser logs the refused request (401) itself; nothing else.
    let logs = browser.severe_logs();
    assert!(logs.iter().all(|l| l.contains("401")), "{logs:?}");
    browser.js("document.querySelector('#token').value = '';", json!([]));
    browser.type_into("#token", TOKEN);
    browser.click("#login button[type=submit]");

    // The configured shards, all up.
    browser.expect(10, "return ['a','b','c'].every(id => document.querySelector(`#shards tr[data-shard=\"${id}\"][data-state=up]`));", json!([]), "the shards are not shown as up");
    let logs = browser.severe_logs();
    assert!(logs.is_empty(), "console errors after login: {logs:?}");
    browser.expect(
        5,
        "return document.querySelector('#status').dataset.state === 'ok';",
        json!([]),
        "the status does not say live",
    );
    // Names from the network reach the page as text, never as markup.
    let evil = r#"<img src=x onerror="window.pwned=1">"#;
    let added = gw.admin(
        "POST",
        "/v1/shards",
        Some(&json!({ "id": evil, "url": "http://127.0.0.1:1", "weight": 0 }).to_string()),
        Some(TOKEN),
    );
    assert_eq!(added.status, 201, "{}", added.text());
    browser.expect(6, "return [...document.querySelectorAll('#shards tr')].some(r => r.dataset.shard === arguments[0] && r.cells[0].textContent === arguments[0]);", json!([evil]), "the shard with markup in its id is not listed as text");
    assert_eq!(
        browser.js(
            "return window.pwned === undefined && !document.querySelector('#shards img');",
            json!([])
        ),
        json!(true)
    );

    // Traffic: one tenant far over its rate limit, others within theirs.
    let port = gw.port;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let load = {
        let stop = std::sync::Arc::clone(&stop);
        std::thread::spawn(move || {
            let mut i = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                // Every tenth request for one of 20 quiet tenants (well
                // within their rate), the rest for one hot tenant.
                let host = if i % 10 == 0 {
                    format!("quiet{}.localhost", (i / 10) % 20)
                } else {
                    "hot.localhost".into()
                };
                let _ = common::send_raw(
                    port,
                    format!("GET / HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n")
                        .as_bytes(),
                );
                i += 1;
                std::thread::sleep(Duration::from_millis(5));
            }
        })
    };
    browser.expect(15, "const r = document.querySelector('#top tbody tr'); return !!r && r.dataset.tenant === 'hot';", json!([]), "the rate-limited tenant is not at the top of the refused list");

    // A shard killed is shown down within a few seconds.
    let killed_at = Instant::now();
    shards[2].stop();
    browser.expect(
        8,
        "return !!document.querySelector('#shards tr[data-shard=\"c\"][data-state=down]');",
        json!([]),
        "the killed shard is not shown down",
    );
    eprintln!(
        "shard shown down {:?} after it was killed",
        killed_at.elapsed()
    );

    // Drain through the button, with its confirmation; the API agrees.
    browser.click("#shards button[data-action=drain][data-shard=\"b\"]");
    confirm(&browser);
    browser.expect(
        6,
        "return !!document.querySelector('#shards tr[data-shard=\"b\"][data-state=draining]');",
        json!([]),
        "the drained shard is not shown draining",
    );
    let listed = gw.admin("GET", "/v1/shards", None, Some(TOKEN)).json();
    let b = listed
        .as_array()
        .and_then(|all| all.iter().find(|s| s["id"] == "b"))
        .cloned()
        .expect("shard b listed");
    assert_eq!(b["draining"], true, "{listed}");
    browser.expect(
        5,
        "return document.querySelector('#toast').textContent.includes('shard b: drain — done');",
        json!([]),
        "the result of the action is not shown",
    );

    // The chart has data, and a screenshot under load is kept.
    std::thread::sleep(Duration::from_secs(3));
    // The chart's legend gives the last interval's refusals per second.
    let drawn = browser.js(
        "return parseFloat(document.querySelector('#legend [data-decision=\"rate-limited\"]').textContent.split(' ')[1]);",
        json!([]),
    );
    assert!(
        drawn.as_f64().is_some_and(|r| r > 10.0),
        "rate-limited per second: {drawn}"
    );
    // Deny the hot tenant from its row; the API lists it, the page too.
    browser.click("#top button[data-action=deny][data-tenant=hot]");
    confirm(&browser);
    assert!(
        eventually(Duration::from_secs(5), || gw
            .admin("GET", "/v1/tenants/denied", None, Some(TOKEN))
            .json()
            == json!(["hot"])),
        "the tenant was not denied"
    );
    browser.expect(
        6,
        "return !!document.querySelector('#denied-list [data-denied=hot]');",
        json!([]),
        "the denied tenant is not listed",
    );
    // The hot tenant's plan is shown in its row; moved to pro from the
    // tenant form, behind a confirmation.
    browser.expect(
        6,
        "const c = document.querySelector('#top tr[data-tenant=hot] td[data-plan]'); return !!c && c.dataset.plan === 'free';",
        json!([]),
        "the plan column does not say free",
    );
    browser.expect(
        6,
        "return !!document.querySelector('#plan option[value=pro]');",
        json!([]),
        "the plans are not offered",
    );
    browser.js(
        "document.querySelector('#tenant').value = 'hot'; document.querySelector('#plan').value = 'pro';",
        json!([]),
    );
    browser.click("#tenant-form button[data-do=plan]");
    confirm(&browser);
    assert!(
        eventually(Duration::from_secs(5), || gw
            .admin("GET", "/v1/tenants/hot", None, Some(TOKEN))
            .json()["plan"]
            == "pro"),
        "the plan was not changed"
    );
    let shot = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/page-under-load.png");
    browser.screenshot(&shot);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let _ = load.join();

    let logs = browser.severe_logs();
    assert!(logs.is_empty(), "console errors: {logs:?}");
}

#[test]
fn the_page_is_served_with_a_strict_policy_and_asks_no_token_on_an_open_loopback_admin() {
    let shard = Backend::start("a");
    let gw = Gateway::start(&config_yaml(
        "listen: [{ addr: \"127.0.0.1:{port}\" }]\nadmin: { addr: \"127.0.0.1:{admin}\" }\nstate: false\n",
        &[("a", shard.url())],
        "",
    ));
    let page = gw.admin("GET", "/", None, None);
    assert_eq!(page.status, 200);
    assert!(page
        .header("content-type")
        .is_some_and(|t| t.starts_with("text/html")));
    let csp = page.header("content-security-policy").unwrap_or_default();
    assert!(
        csp.contains("script-src 'self'") && csp.contains("frame-ancestors 'none'"),
        "{csp}"
    );
    assert!(!page.text().contains("<script>"), "no inline script");
    assert_eq!(gw.admin("GET", "/ui/app.js", None, None).status, 200);
    assert_eq!(gw.admin("GET", "/ui/app.css", None, None).status, 200);
    assert_eq!(
        gw.admin("GET", "/ui/auth", None, None).json()["token_required"],
        false
    );
    let top = gw.admin("GET", "/v1/tenants/top?by=refused", None, None);
    assert_eq!(top.status, 200);
    assert_eq!(top.json()["tenants"], json!([]));
    assert_eq!(
        gw.admin("GET", "/v1/tenants/top?by=requests", None, None)
            .status,
        400
    );
    assert_eq!(
        gw.admin("GET", "/v1/tenants/top?n=0", None, None).status,
        400
    );
    // In a browser: no token asked, the shard shown, and the sections of
    // what is not configured (cluster, TLS) hidden.
    let Some(browser) = Browser::start() else {
        return;
    };
    browser.goto(&format!("http://127.0.0.1:{}/", gw.admin_port));
    browser.expect(
        10,
        "return !!document.querySelector('#shards tr[data-shard=a][data-state=up]');",
        json!([]),
        "the open page does not show the shard",
    );
    assert!(!browser.visible("#login"), "asked for a token nobody set");
    assert!(!browser.visible("#cluster") && !browser.visible("#certs"));
    let logs = browser.severe_logs();
    assert!(logs.is_empty(), "console errors: {logs:?}");
}
