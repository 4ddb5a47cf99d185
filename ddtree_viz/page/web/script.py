"""The page's own script and style: keys, node clicks, each figure drawn once (those off screen after those in
view), the report's round links; the download buttons' click; the CSS."""

from ...render import report as report_view

KEYS_JS = """
() => {
  const ACTIONS = '#ddv-step, #ddv-run, #ddv-check-transformers, #ddv-reset, #ddv-back, #ddv-forward';
  // the node inspector: a click on a tree node writes its tree position into the hidden #ddv-inspect-click box
  // (gr.Plot forwards no plotly events); a nonce makes a second click on the same node count too
  const hook = () => {
    document.querySelectorAll('#ddv-tree .js-plotly-plot').forEach((plot) => {
      if (plot._ddvHooked || !plot.on) return;
      plot._ddvHooked = true;
      plot.on('plotly_click', (ev) => {
        const pt = ev && ev.points && ev.points[0];
        if (!pt || pt.customdata === undefined || pt.customdata === null) return;
        const box = document.querySelector('#ddv-inspect-click textarea, #ddv-inspect-click input');
        if (!box) return;
        box.value = pt.customdata + ':' + Date.now();
        box.dispatchEvent(new Event('input', {bubbles: true}));
      });
    });
  };
  // gradio's Plot re-mounts its plotly div for every new figure, after the old div's own update has drawn that
  // figure into the old div, which is then removed: every figure was drawn twice a Step (~0.3 s of the browser's
  // ~0.6 s on a 2-core machine). A div of the page that has been drawn is not drawn again: a new figure always
  // arrives in a new div (and the same figure again needs no drawing).
  // And only the tree is drawn in the update that brings it: every other figure follows, those in view first,
  // in one task after the frame that shows the status and the tree, or sooner if it scrolls near the window.
  const drawOnce = () => {
    const P = window.Plotly;
    if (!P || P._ddvOnce) return;
    P._ddvOnce = true;
    const react = P.react, resize = P.Plots.resize;
    const pending = new Set();  // figures waiting off screen
    const ours = (gd) => gd && gd.closest && gd.closest('[id^="ddv-"]');
    P._ddvDraws = 0;  // figures drawn since (a test counts them: one a figure a Step)
    Object.defineProperty(P, '_ddvPending', {get: () => pending.size});  // (read by tests and bench_page)
    P._ddvOrder = [];  // the last figures drawn, oldest first, by their component's id (a test reads the order)
    const drawn = (gd) => {
      gd._ddvDrawn = true;
      P._ddvDraws += 1;
      const id = (ours(gd) || {}).id;
      // the start of the frame that paints a new tree (bench_page's "click to the tree drawn")
      if (id === 'ddv-tree') requestAnimationFrame(() => { P._ddvTreeFrame = performance.now(); });
      P._ddvOrder.push(id);
      if (P._ddvOrder.length > 64) P._ddvOrder.shift();
    };
    const near = (gd) => {
      if (gd.offsetParent === null) return false;  // not laid out (another tab)
      const r = gd.getBoundingClientRect();
      return r.bottom > -200 && r.top < window.innerHeight + 200;
    };
    const draw = (gd) => {
      if (!pending.delete(gd)) return;
      seen.unobserve(gd);
      if (!gd.isConnected) return;  // a newer figure replaced it first
      react.call(P, gd, ...gd._ddvArgs);
      gd._ddvArgs = null;
      drawn(gd);
    };
    const seen = new IntersectionObserver((entries) => {
      entries.forEach((e) => { if (e.isIntersecting) draw(e.target); });
    }, {rootMargin: '200px'});
    // after the frame that shows the update which brought them (so what is in view is painted first), the figures
    // waiting are drawn in one task, those in view first, and the browser paints them in one frame. One figure a
    // task cost a frame after each (the page laid out, layerized and painted again each time: rendering took
    // ~0.5 s of a budget-128 Step's main thread in Chromium's trace; issue #26). A click or key waiting (isInputPending, where the browser
    // has it) ends the task early: the rest follow in the next.
    const inputWaiting = () => { const s = navigator.scheduling; return !!(s && s.isInputPending && s.isInputPending()); };
    let draining = false;
    const schedule = (how) => {
      if (draining) return;
      draining = true;
      if (how === 'frame') requestAnimationFrame(() => setTimeout(drain, 0));
      else setTimeout(drain, how === 'later' ? 250 : 0);
    };
    const drain = () => {
      draining = false;
      for (const gd of pending) if (!gd.isConnected) draw(gd);  // gone: forgotten
      const shown = [...pending].filter((gd) => gd.offsetParent !== null);
      const inView = shown.filter(near);
      for (const gd of [...inView, ...shown.filter((gd) => !inView.includes(gd))]) {  // those in view first
        draw(gd);
        if (inputWaiting()) break;
      }
      if (pending.size) schedule(shown.length ? 'next' : 'later');  // hidden ones (another tab): looked at again shortly
    };
    P.react = function (gd, ...args) {
      if (gd && ours(gd)) {
        if (gd._ddvDrawn) return Promise.resolve(gd);
        const waiting = pending.has(gd);  // then a newer figure for it replaces the older
        // only the tree is drawn at once (in view): the status and the tree are painted first, every other
        // figure follows one a task (issue #26: click to tree drawn)
        // (near last: its layout, forced in the middle of gradio's update, is needed for the tree only)
        if (waiting || !gd.closest('#ddv-tree') || !near(gd)) {
          gd._ddvArgs = args;
          if (!waiting) { pending.add(gd); seen.observe(gd); }
          schedule('frame');
          return Promise.resolve(gd);
        }
      }
      const out = react.call(this, gd, ...args);
      if (gd) drawn(gd);
      return out;
    };
    P.Plots.resize = function (gd, ...args) {  // gradio resizes right after react: not a figure still waiting
      if (gd && pending.has(gd)) return Promise.resolve(gd);
      return resize.call(this, gd, ...args);
    };
  };
  new MutationObserver(() => { drawOnce(); hook(); }).observe(document.body, {childList: true, subtree: true});
  document.addEventListener('keydown', (e) => {
    const t = e.target;
    if (t && (t.tagName === 'INPUT' || t.tagName === 'TEXTAREA' || t.isContentEditable)) return;
    const id = {'s': 'ddv-step', 'ArrowLeft': 'ddv-back', 'ArrowRight': 'ddv-forward'}[e.key];
    // only while the Step tab is shown (its buttons are hidden under the Analyze tab)
    if (id) { const b = document.getElementById(id); if (b && b.offsetParent !== null) { b.click(); e.preventDefault(); } }
  });
  // Step clicks while a Step is on its way: stopped here, before gradio's own handler sees them (the Step button
  // takes every click, trigger_mode "multiple", so that one made while the last round's check runs goes on), and
  // said beside the buttons, not silently lost. A Step is on its way from its click until the status
  // line changes (its answer, or its error), 60 s at most, and while gradio shows it pending (its progress tracker
  // on the status line) or in its first 2 s (before the tracker shows): a status answered with the same text again
  // leaves no mutation to see, and the next click must not be stopped then.
  let stepping = 0;
  const pending = () => !!document.querySelector('#ddv-status .progress-text, #ddv-status .pending');
  document.addEventListener('click', (e) => {
    const b = e.target && e.target.closest ? e.target.closest('#ddv-step') : null;
    if (!b) return;
    const since = Date.now() - stepping;
    if (stepping && since < 60000 && (since < 2000 || pending())) {
      e.stopImmediatePropagation();
      e.preventDefault();
      let n = document.getElementById('ddv-busy');
      if (!n) {
        n = document.createElement('div');
        n.id = 'ddv-busy';
        n.setAttribute('role', 'status');
        n.style.cssText = 'color:#a15c00;font-size:90%;padding:2px 4px';
        b.parentElement.insertAdjacentElement('afterend', n);
      }
      n.textContent = 'Still working on the last Step: this click is ignored (one Step at a time).';
      n.hidden = false;
      clearTimeout(n._ddvHide);
      n._ddvHide = setTimeout(() => { n.hidden = true; }, 3000);
      return;
    }
    const status = document.getElementById('ddv-status');
    if (!status) return;
    stepping = Date.now();
    const seen = new MutationObserver(() => { stepping = 0; seen.disconnect(); });
    // the Markdown's own text, not the progress tracker beside it (its timer ticks while the Step is on its way)
    seen.observe(status.querySelector('.prose, .md') || status, {childList: true, subtree: true, characterData: true});
  }, true);
  // issue #65.1: after an action (Step, Run, the check, Reset, Back, Forward, and their keys) the round's headline
  // and its tree on the first screen, an error where the eye is: when the status line next changes (the answer,
  // the first round of a Run, or the error), it is scrolled to the top of the window if it or the tree under it is
  // out of view (at 1280x800 the status sat at y ~1100, under the settings)
  document.addEventListener('click', (e) => {
    const b = e.target && e.target.closest ? e.target.closest(ACTIONS) : null;
    const status = b && document.getElementById('ddv-status');
    if (!status) return;
    const text = status.querySelector('.prose, .md') || status;
    if (text._ddvReveal) text._ddvReveal.disconnect();
    const seen = new MutationObserver(() => {
      seen.disconnect();
      text._ddvReveal = null;
      const tree = document.getElementById('ddv-tree');
      const r = status.getBoundingClientRect(), t = tree ? tree.getBoundingClientRect() : r;
      if (r.top < 0 || Math.max(r.bottom, t.bottom) > window.innerHeight) status.scrollIntoView({block: 'start'});
    });
    text._ddvReveal = seen;
    seen.observe(text, {childList: true, subtree: true, characterData: true});
  }, true);
  // the Analyze tab: a click on a round link of the report writes 'file|round|nonce' into the hidden
  // #ddv-report-click box, which opens that round in the Step tab (the link's own href goes nowhere)
  document.addEventListener('click', (e) => {
    const a = e.target && e.target.closest ? e.target.closest('#ddv-report a.ddv-open-round') : null;
    if (!a) return;
    e.preventDefault();
    const box = document.querySelector('#ddv-report-click textarea, #ddv-report-click input');
    if (!box) return;
    box.value = a.dataset.file + '|' + a.dataset.round + '|' + Date.now();
    box.dispatchEvent(new Event('input', {bubbles: true}));
  });
""" + report_view.SCRIPT + """
}
"""


def click_js(elem_id: str) -> str:
    """After a file is prepared, click its download button once it holds the new file: one click for the user saves
    it. The button is waited for (up to 30 s), not assumed: the first time it shows, Gradio loads its component's
    code before drawing it, which took over 250 ms on a loaded machine and the click found no button (a CI failure).
    A button that still shows the file clicked last (same label) is given 3 s to change; a file of the same name
    (made within the same second) is clicked then."""
    return """
() => new Promise((done) => {
  const start = Date.now();
  const tick = () => {
    const el = document.getElementById('%s');
    const b = el && (el.tagName === 'BUTTON' ? el : el.querySelector('button'));
    const label = b ? b.textContent.trim() : '';
    const waited = Date.now() - start;
    if (b && (label !== el.dataset.ddvClicked || waited > 3000)) {
      el.classList.remove('ddv-stale');  // the new file's button (stale_js hid the old one)
      el.dataset.ddvClicked = label;
      b.click();
      done();
    } else if (waited > 30000) {
      done();
    } else {
      setTimeout(tick, 100);
    }
  };
  setTimeout(tick, 100);
})
""" % elem_id


def stale_js(elem_id: str) -> str:
    """A download button's file no longer matches the settings (one changed, or a new file is being made): hidden at
    once, in the browser. The server's answer took 1-3 s, during which the old file (an SVG, with PNG asked) was one
    click away (issue #26); click_js shows the button again with the new file."""
    return ("() => { const el = document.getElementById('%s'); if (el) el.classList.add('ddv-stale'); }" % elem_id)


# after a report's round opened in the Step tab: its status line (and the tree under it) at the top of the window
SHOW_STATUS_JS = "() => { const s = document.getElementById('ddv-status'); if (s) s.scrollIntoView({block: 'start'}); }"

CSS = (".ddv-out { font-family: monospace; } #ddv-status { min-height: 2.5em; } "
       ".ddv-hidden, .ddv-stale { display: none !important; } "
       ".ddv-special { color: #0072B2; } .ddv-ws { color: #999999; } "  # prompt view: template markers, whitespace
       + report_view.scoped_css("#ddv-report"))  # the Analyze tab's copy of an analyze report
