//! The operator console in a real browser: headless Chromium (Debian `chromium`) driven by
//! `playwright-core` (tests/console/console.mjs) against the real binary while traffic flows.
//! `scripts/install-test-tools.sh` installs both; a missing one fails the test, never skips it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use support::http;
use support::process::Floodgate;

// `user`: 5 an hour, a token every 12 minutes. The page inspects the bucket the test
// exhausted and expects 0 left; at 5 a minute a token came back 12 s later, which a loaded
// machine spends starting Chromium and waiting for the traffic's numbers.
const LIMITS: &str = "\
domain: shop
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 5}
  - key: plan
    value: premium
    rate_limits:
      - {unit: second, requests_per_unit: 50}
      - {unit: day, requests_per_unit: 100000, name: daily}
  - key: crawler
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 2, algorithm: fixed_window}
";

const TOKEN: &str = "browser-test-token";

async fn hit(addr: SocketAddr, key: &str, value: &str) -> u16 {
    let body = format!(
        r#"{{"domain":"shop","descriptors":[{{"entries":[{{"key":"{key}","value":"{value}"}}]}}]}}"#
    );
    http::post_json(addr, &body).await.status
}

/// The dashboard's numbers move with traffic, a bucket exhausted by traffic is inspected and
/// reset through the page, after which ShouldRateLimit admits it again. The screenshot goes
/// to a temporary directory, or to `$FLOODGATE_CONSOLE_SCREENSHOT` when set (the README's
/// `docs/img/console.png` is refreshed that way), so a test run never edits the checkout.
#[tokio::test]
async fn dashboard_in_headless_chromium() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let chromium = std::env::var("CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into());
    assert!(
        Path::new(&chromium).exists(),
        "{chromium} is missing: run scripts/install-test-tools.sh (Debian package chromium)"
    );
    assert!(
        root.join("tests/console/node_modules/playwright-core")
            .is_dir(),
        "playwright-core is missing: run scripts/install-test-tools.sh (npm ci in tests/console)"
    );

    let dir = tempfile::tempdir().unwrap();
    let limits = dir.path().join("limits.yaml");
    std::fs::write(&limits, LIMITS).unwrap();
    let token = dir.path().join("token");
    std::fs::write(&token, TOKEN).unwrap();
    let server = Floodgate::start(&[
        "--config",
        limits.to_str().unwrap(),
        "--admin-token-file",
        token.to_str().unwrap(),
    ]);
    let addr = server.http;

    // Exhaust the bucket the page will inspect and reset.
    for _ in 0..5 {
        assert_eq!(hit(addr, "user", "alice").await, 200);
    }
    assert_eq!(hit(addr, "user", "alice").await, 429);

    // Steady traffic while the page watches: admitted, denied and shadow-mode hits.
    let running = Arc::new(AtomicBool::new(true));
    let traffic = tokio::spawn({
        let running = running.clone();
        async move {
            let mut i = 0u64;
            while running.load(Ordering::Relaxed) {
                hit(addr, "user", &format!("u{}", i % 40)).await;
                hit(addr, "plan", "premium").await;
                hit(addr, "crawler", "bot").await;
                i += 1;
                // Pacing only (a load generator), not synchronisation.
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    });

    let screenshot = match std::env::var_os("FLOODGATE_CONSOLE_SCREENSHOT") {
        Some(path) => std::path::PathBuf::from(path),
        None => dir.path().join("console.png"),
    };
    std::fs::create_dir_all(screenshot.parent().unwrap()).unwrap();
    let mut node = std::process::Command::new("node");
    node.arg(root.join("tests/console/console.mjs"))
        .env("FLOODGATE_ADMIN", format!("http://{addr}"))
        .env("FLOODGATE_TOKEN", TOKEN)
        .env("SCREENSHOT", &screenshot)
        .env("CHROMIUM", &chromium);
    let out = tokio::task::spawn_blocking(move || node.output())
        .await
        .unwrap()
        .unwrap();
    running.store(false, Ordering::Relaxed);
    traffic.await.unwrap();
    assert!(
        out.status.success(),
        "the browser test failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(std::fs::metadata(&screenshot).unwrap().len() > 10_000);

    // The reset done through the page is real: the bucket admits again.
    assert_eq!(hit(addr, "user", "alice").await, 200);
    let log = server.stop().await;
    assert!(log.contains("console: buckets reset"), "{log}");
}
