// Drives the operator console in headless Chromium (run by tests/console_browser.rs, which
// starts floodgate and sends traffic meanwhile). Checks that the page's numbers move with the
// traffic, inspects a bucket the test exhausted, resets it through the page, and saves a
// screenshot. Exits non-zero on any failure; a missing Chromium is a failure, not a skip.
//
// Environment: FLOODGATE_ADMIN (http://host:port), FLOODGATE_TOKEN, SCREENSHOT (path),
// CHROMIUM (default /usr/bin/chromium).
import { chromium } from "playwright-core";

const admin = process.env.FLOODGATE_ADMIN;
const token = process.env.FLOODGATE_TOKEN;
const screenshot = process.env.SCREENSHOT;
const executablePath = process.env.CHROMIUM || "/usr/bin/chromium";
// A guard against a hang, with room for a loaded machine (Chromium included).
const TIMEOUT = 30000;

function fail(message) {
  console.error("console test: " + message);
  process.exit(1);
}

if (!admin || !token || !screenshot) fail("FLOODGATE_ADMIN, FLOODGATE_TOKEN and SCREENSHOT are required");

const browser = await chromium.launch({
  executablePath,
  headless: true,
  // Root in CI containers: Chromium's sandbox needs user namespaces it often lacks there.
  args: ["--no-sandbox", "--disable-gpu"],
});
try {
  const page = await browser.newPage({ viewport: { width: 1280, height: 760 } });
  const external = [];
  page.on("request", (request) => {
    if (!request.url().startsWith(admin)) external.push(request.url());
  });
  page.setDefaultTimeout(TIMEOUT);
  await page.goto(admin + "/");
  // With a token configured, the dashboard's data needs it too: typed in as an operator does.
  await page.fill("#token", token);

  // The numbers move with the traffic: the total of a rule grows, and its rate goes above 0.
  const total = page.locator('[data-total="rule:shop.user"]');
  await total.waitFor();
  const first = Number(await total.textContent());
  await page.waitForFunction(
    (before) => Number(document.querySelector('[data-total="rule:shop.user"]').textContent) > before,
    first,
    { timeout: TIMEOUT },
  );
  await page.waitForFunction(
    () => Number(document.querySelector('[data-rate="rule:shop.user:hits"]').textContent) > 0,
    null,
    { timeout: TIMEOUT },
  );
  await page.waitForFunction(
    () => Number(document.querySelector('[data-rate="domain:shop:hits"]').textContent) > 0,
    null,
    { timeout: TIMEOUT },
  );
  // The limits come one page at a time: this server has one domain, so one page of one.
  const pageInfo = await page.locator("#page-info").textContent();
  if (pageInfo !== "domains 1–1 of 1") fail("page info " + pageInfo);
  if (!(await page.locator("#page-next").isDisabled())) fail("a next page of one domain");
  const storeName = await page.locator("#store-name").textContent();
  if (storeName !== "memory") fail("store shown as " + storeName);

  // Inspect the bucket the test exhausted: nothing left.
  await page.fill("#search-domain", "shop");
  await page.fill("#search-entries", "user=alice");
  await page.click("#search-button");
  const remaining = page.locator("[data-remaining]").first();
  await remaining.waitFor();
  const before = await remaining.textContent();
  if (before !== "0") fail("inspected remaining " + before + ", expected 0");

  // Reset it through the page (with the token): full again.
  await page.fill("#token", token);
  await page.click("[data-reset]");
  await page.waitForFunction(
    () => document.querySelector("[data-remaining]")?.textContent === "5",
    null,
    { timeout: TIMEOUT },
  );
  const error = await page.locator("#inspect-error").textContent();
  if (error) fail("reset error: " + error);

  if (external.length > 0) fail("the page fetched external resources: " + external.join(", "));
  await page.screenshot({ path: screenshot, fullPage: true });
  console.log("console test: ok, screenshot in " + screenshot);
} finally {
  await browser.close();
}
