// The page's router: the server serves this same page at every UI path; the path picks the view.
import { $, errorBox } from "./common.js";
import { graphPage } from "./graph.js";
import * as status from "./status.js";
import * as views from "./views.js";

const PAGES = {
  "/graph": ["Graph", graphPage],
  "/alerts": ["Alerts", status.alertsPage],
  "/rules": ["Rules", status.rulesPage],
  "/targets": ["Targets", status.targetsPage],
  "/service-discovery": ["Service discovery", status.serviceDiscoveryPage],
  "/tsdb-status": ["TSDB status", status.tsdbPage],
  "/flags": ["Command-line flags", status.flagsPage],
  "/config": ["Configuration", status.configPage],
  "/status": ["Runtime & build information", status.statusPage],
  "/planner": ["Planner", views.plannerPage],
  "/query-log": ["Query log", views.queryLogPage],
  "/cost": ["Cost report", views.costPage],
  "/cardinality": ["Cardinality explorer", views.cardinalityPage],
  "/congestion": ["Congestion", views.congestionPage],
  "/audit": ["KedgeFlow audit", views.auditPage],
};

async function start() {
  const path = location.pathname.replace(/\/+$/, "") || "/graph";
  const [title, render] = PAGES[path] || PAGES["/graph"];
  document.title = `${title} · TurboProm`;
  for (const a of document.querySelectorAll("#nav a")) {
    const on = a.getAttribute("href") === path;
    a.classList.toggle("active", on);
    if (on) a.closest(".menu")?.querySelector("button").classList.add("active");
  }
  const main = $("#main");
  main.dataset.page = path.slice(1);
  try {
    await render(main);
    main.dataset.ready = "1";
  } catch (e) {
    console.warn(e);
    main.append(errorBox(e));
    main.dataset.ready = "error";
  }
}

for (const m of document.querySelectorAll(".menu")) {
  const b = m.querySelector("button");
  b.addEventListener("click", e => { e.stopPropagation(); document.querySelectorAll(".menu.open").forEach(x => x !== m && x.classList.remove("open")); m.classList.toggle("open"); });
}
document.addEventListener("click", () => document.querySelectorAll(".menu.open").forEach(x => x.classList.remove("open")));
start();
