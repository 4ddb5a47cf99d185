/* ddtree-viz: a session supplement's own script (render/supplement.py inlines it once, after plotly.js).

It reads the session from the JSON script element #ddt-data and draws the round on screen from it:
the draft tree (render/layout.py's tidy rows, computed here from the parents), the verify pass's mask (the
ancestor matrix), the per-layer cache strip, why the walk stopped, the output so far against the reference, and the
round among the session's tokens per round. Keys: left / right arrow, Home, End; the address's #round=N opens round
N and follows the stepping. Token text is untrusted: it reaches the page through textContent and attributes only,
and plotly through ptext (plotly draws a small HTML subset of its own: &, < and > as entities). */
(function () {
  'use strict';
  var D = JSON.parse(document.getElementById('ddt-data').textContent);
  var S = D.style, C = S.colors, M = D.meta;
  var TOK = D.tokens, IDS = unpack(D.ids), OUT = unpack(D.out), REF = D.ref === null ? null : unpack(D.ref);
  var FIRST = D.first, LAST = D.first + D.steps.length - 1, N = D.rounds_total, KEPT = D.kept;
  var CONFIG = {displaylogo: false, responsive: true};
  var decoded = {}, current = null, seq = 0;
  var $ = function (id) { return document.getElementById(id); };

  // ---- data -------------------------------------------------------------------------------------------------

  function unpack(text) {  // supplement.pack_ints' inverse: 5 bits a character, least significant first
    var out = [], value = 0, scale = 1;
    for (var i = 0; i < text.length; i++) {
      var d = D.alphabet.indexOf(text.charAt(i));
      value += (d & 31) * scale;  // (ids reach 2^31: no bit operators on the sum)
      if (d >= 32) { scale *= 32; } else { out.push(value); value = 0; scale = 1; }
    }
    return out;
  }

  function round(k) {  // round k of the session (0-based), its columns decoded once
    if (decoded[k]) return decoded[k];
    var R = D.steps[k - FIRST], n = R.n, moves = unpack(R.p);
    var T = {index: k, n: n, parent: [-1], depth: [0], tok: [R.o], lp: [0], score: [0], accepted: R.a, bonus: R.b,
             committed: R.c, stop: R.s, naive: (R.x || M.verify) === 'naive', cache: R, rank: [-1]};
    var i, table = null, ts = R.t === undefined ? null : unpack(R.t), ls = ts ? unpack(R.l) : null, kids = {};
    for (i = 1; i < n; i++) {  // each parent as the change from the one before (zigzag: 0, -1, 1, -2, ...)
      var move = moves[i - 1], parent = (i > 1 ? T.parent[i - 1] : 0) + (move % 2 ? -(move + 1) / 2 : move / 2);
      T.parent.push(parent);
      T.depth.push(T.depth[parent] + 1);
      T.rank.push(kids[parent] = (kids[parent] === undefined ? 0 : kids[parent] + 1));  // its earlier siblings
    }
    if (R.r !== undefined) T.rank = unpack(R.r).map(function (r) { return r - 1; });  // ranks written out
    if (!ts) {
      var g = unpack(R.g), at = 0;
      table = [];
      while (at < g.length) {  // per depth: its width, then per rank token + 1 (0: not taken) and the log-prob's step
        var width = g[at++], row = [], above = 0;
        for (var r = 0; r < width; r++) {
          var t = g[at++];
          if (t) { above += g[at++]; row.push([t - 1, above]); } else { row.push(null); }
        }
        table.push(row);
      }
    }
    for (i = 1; i < n; i++) {
      var cell = ts ? [ts[i - 1], ls[i - 1]] : table[T.depth[i] - 1][T.rank[i]];
      T.tok.push(cell[0]);
      T.lp.push(-cell[1] / 100);
      T.score.push(T.score[T.parent[i]] + T.lp[i]);
    }
    decoded[k] = T;
    return T;
  }

  // ---- text -------------------------------------------------------------------------------------------------

  function ptext(s) { return String(s).replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;'); }
  function length(s) { return Array.from(s).length; }  // characters, as Python counts them
  function shorten(s, n) {
    var c = Array.from(s);
    return c.length <= n ? s : c.slice(0, Math.max(n - 1, 1)).join('') + '…';
  }
  function plural(n, word) { return n.toLocaleString('en-US') + ' ' + word + (n === 1 ? '' : 's'); }
  function el(tag, cls, text) {
    var e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = text;
    return e;
  }
  function tokCode(i) {  // a token as the page's inspector shows it: its visible text, then its id
    var f = document.createDocumentFragment();
    f.appendChild(el('code', 'tok', TOK[i]));
    f.appendChild(document.createTextNode(' '));
    f.appendChild(el('small', 'meta', String(IDS[i])));
    return f;
  }
  function humanBytes(n) {  // cache_view.human_bytes
    var units = ['B', 'KiB', 'MiB', 'GiB'];
    for (var u = 0; u < units.length; u++) {
      if (Math.abs(n) < 1024 || u === units.length - 1) return u === 0 ? n.toFixed(0) + ' B' : n.toFixed(1) + ' ' + units[u];
      n /= 1024;
    }
  }
  function clone(x) { return JSON.parse(JSON.stringify(x)); }

  // ---- the tree (render/layout.py and tree_plot.py) -------------------------------------------------------

  function rows(T, last) {  // layout._tidy_rows: leaves on consecutive rows depth first, parents midway
    var n = T.n, bonus = n, kids = [], i;
    for (i = 0; i <= n; i++) kids.push([]);
    for (i = 1; i < n; i++) kids[T.parent[i]].push(i);
    kids[last].push(bonus);
    var rank = function (i) { return i < n ? T.rank[i] : 0; };
    kids.forEach(function (k) {
      k.sort(function (a, b) { return (a === bonus) - (b === bonus) || rank(a) - rank(b) || a - b; });
    });
    var y = new Array(n + 1), next = 0, stack = [[0, false]];
    while (stack.length) {
      var top = stack.pop(), node = top[0], k = kids[node];
      if (!k.length) { y[node] = next++; } else if (top[1]) { y[node] = (y[k[0]] + y[k[k.length - 1]]) / 2; } else {
        stack.push([node, true]);
        for (i = k.length - 1; i >= 0; i--) stack.push([k[i], false]);
      }
    }
    return y;
  }

  function roleOf(T, i, onPath, last) {
    if (i === T.n) return 'bonus';
    if (i === 0) return 'root';
    if (onPath[i]) return 'accepted';
    return T.parent[i] === last ? 'first_rejected' : 'other';
  }

  function hover(T, i, role) {  // tree_plot.node_hover's lines the supplement has data for
    var bonus = i === T.n, tok = bonus ? T.bonus : T.tok[i];
    var lines = ['<b>' + ptext(TOK[tok]) + '</b>  (id ' + IDS[tok] + ')'];
    if (bonus) {
      lines.push("bonus: the target's own token after the accepted path, depth " + T.accepted.length);
    } else {
      lines.push('position ' + i + ' · depth ' + T.depth[i] + ' · rank ' + (T.rank[i] < 0 ? 'root' : 'r' + T.rank[i]));
      if (i > 0) lines.push('drafter log-prob ' + T.lp[i].toFixed(2) + ' · path ' + T.score[i].toFixed(2));
    }
    if (role !== 'other' && role !== 'root') lines.push(S.role_name[role]);
    return lines.join('<br>');
  }

  function nodeTrace(T, role, ids, x, y, onPath) {
    var fixed = role === 'root' ? C.neutral : role === 'bonus' ? C.bonus : null;
    var marker = fixed ? {color: fixed} : {color: ids.map(function (i) { return T.lp[i]; }), coloraxis: 'coloraxis'};
    var outlined = ids.map(function (i) { return !!onPath[i] || role === 'bonus'; });
    marker.symbol = S.role_symbol[role];
    marker.size = S.node_size + (role === 'bonus' ? 4 : 0);
    marker.line = {color: outlined.map(function (o) { return o ? C.path : role === 'first_rejected' ? C.rejected : C.outline; }),
                   width: outlined.map(function (o) { return o ? S.outline_width : 1; })};
    return {type: 'scatter', x: ids.map(function (i) { return x[i]; }), y: ids.map(function (i) { return y[i]; }),
            mode: 'markers+text', textposition: 'top center', textfont: {size: 11},
            text: ids.map(function (i) {
              var tok = i === T.n ? T.bonus : T.tok[i], rank = i === T.n ? -1 : T.rank[i];
              return ptext(shorten(TOK[tok], S.label_chars)) + (rank >= 0 ? ' <sub>r' + rank + '</sub>' : '');
            }),
            hovertext: ids.map(function (i) { return hover(T, i, role); }), hoverinfo: 'text', customdata: ids,
            marker: marker, name: S.role_name[role], legendgroup: role};
  }

  function treeTitle(T) {  // tree_plot.default_title
    var gained = T.accepted.length, kept = KEPT[T.index];
    var walk = 'accepted ' + plural(gained - 1, 'draft') + ' + bonus = ' + plural(gained, 'token');
    if (kept < gained) walk += ', ' + kept + ' kept: the session stopped there';
    return 'Round ' + (T.index + 1) + ' · ' + plural(T.n, 'tree position') + ' · ' + walk + (T.naive ? ' · NAIVE verify (known-wrong)' : '');
  }

  function treeFigure(T) {
    var n = T.n, last = T.accepted[T.accepted.length - 1], onPath = {}, i;
    T.accepted.forEach(function (a) { onPath[a] = true; });
    var y = rows(T, last), x = T.depth.concat([T.depth[last] + 1]);
    var edges = {edge: {x: [], y: []}, path: {x: [], y: []}, bonus: {x: [], y: []}};
    var edge = function (kind, a, b) { edges[kind].x.push(x[a], x[b], null); edges[kind].y.push(y[a], y[b], null); };
    for (i = 1; i < n; i++) edge(onPath[i] ? 'path' : 'edge', T.parent[i], i);
    edge('bonus', last, n);
    var data = S.edge_kinds.map(function (kind) {
      var line = S.edge_line[kind];
      return {type: 'scatter', x: edges[kind].x, y: edges[kind].y, mode: 'lines', hoverinfo: 'skip',
              line: {color: kind === 'edge' ? C.edge : C.path, width: line[0], dash: line[1]},
              name: S.edge_name[kind], showlegend: kind === 'bonus', legendgroup: S.edge_group[kind]};
    });
    var byRole = {};
    for (i = 0; i <= n; i++) { var r = roleOf(T, i, onPath, last); (byRole[r] = byRole[r] || []).push(i); }
    S.draw_order.forEach(function (role) { if (byRole[role]) data.push(nodeTrace(T, role, byRole[role], x, y, onPath)); });
    var height = Math.max.apply(null, y) + 1, layout = clone(D.figures.tree);
    layout.title = {text: treeTitle(T), font: {size: 14}};
    layout.height = Math.floor(Math.min(Math.max(360, S.top_px + S.bottom_px + S.row_px * (height + 0.6)), S.max_height));
    layout.xaxis.range = [-0.5, Math.max.apply(null, x) + S.label_room];
    layout.yaxis.range = [height - 1 + 0.5, -0.9];
    layout.template = D.figures.template;
    return {data: data, layout: layout};
  }

  // ---- the verify mask (render/mask_plot.py) --------------------------------------------------------------

  function maskFigure(T) {
    var n = Math.min(T.n, S.mask_positions), isAcc = {}, i;
    var accepted = T.accepted.filter(function (a) { return a < n; }).sort(function (a, b) { return a - b; });
    accepted.forEach(function (a) { isAcc[a] = true; });
    var label = function (i) { return i + ':' + shorten(TOK[T.tok[i]], S.mask_chars); };
    var rowLabels = [], cols = ['prefix (' + T.committed + ' tokens)'], z = [];
    for (i = 0; i < n; i++) {
      rowLabels.push((isAcc[i] ? '✓ ' : '') + label(i));
      cols.push(label(i));
      var row = new Array(n + 1).fill(0);
      row[0] = 1;  // the committed prefix, one band
      for (var j = i; j >= 0; j = T.parent[j]) row[j + 1] = 1;  // the position and its ancestors
      z.push(row);
    }
    var heat = clone(D.figures.mask.heat), layout = clone(D.figures.mask.layout);
    heat.z = z;
    heat.x = cols.map(ptext);
    heat.y = rowLabels.map(ptext);
    heat.xgap = heat.ygap = n <= 64 ? 1 : 0;
    var height = Math.floor(Math.min(Math.max(360, 190 + 16 * n), 1600));
    var widest = Math.max.apply(null, rowLabels.map(length));
    layout.title.text = 'Verify mask, round ' + (T.index + 1) + (n < T.n ? ' (first ' + n + ' of ' + T.n + ' tree positions)' : '');
    layout.height = height;
    layout.yaxis.nticks = Math.min(S.mask_ticks, Math.max(8, Math.floor((height - 190) / S.row_tick_px)));
    layout.margin.l = 34 + Math.floor(widest * 7.5 + 0.999) + 10;  // figure.title_axis_px
    layout.margin.r = 20 + Math.floor(Math.floor(length(cols[cols.length - 1]) * 7.5 + 0.999) / 2);
    layout.shapes = accepted.map(function (r) {
      return {type: 'rect', x0: -0.5, x1: n + 0.5, y0: r - 0.5, y1: r + 0.5, line: {color: C.path, width: 2}};
    });
    layout.template = D.figures.template;
    return {data: [heat], layout: layout};
  }

  // ---- the cache strip (render/cache_view.py) -------------------------------------------------------------

  function perLayer(perKind) {
    var used = perKind.map(function () { return 0; });
    return D.layers.map(function (L) { var v = perKind[L[1]]; return Array.isArray(v) ? v[used[L[1]]++] : v; });
  }

  function changed(T, kind, kv) {  // cache_view._what_changed
    var t = T.n, a = T.accepted.length;
    if (kind === 'GDN') {
      return T.naive ? 'state after the whole flattened tree (' + plural(t, 'position') + ', rejected branches included) kept (naive, known-wrong)'
        : "conv/recurrent state replaced by the accepted path's (" + plural(a, 'token') + ')';
    }
    return kv === null ? '–' : '+' + plural(t, 'row') + ' appended, compacted to +' + a;
  }

  function cacheStrip(T) {
    var box = $('ddt-cache'), R = T.cache;
    box.textContent = '';
    if (!R.m || !D.layers.length) { box.appendChild(el('p', 'meta', 'no cache recorded for this round')); return; }
    var after = perLayer(R.m), before = R.v ? perLayer(R.v) : null, kv = perLayer(R.kv), strip = el('div', 'ddt-strip');
    var total = 0;
    D.layers.forEach(function (L, i) {
      var kind = D.kinds[L[1]], cell = el('span', 'ddt-layer', String(L[0]));
      var lines = ['layer ' + L[0] + ' · ' + kind + ' · ' + L[2],
                   'bytes after commit: ' + humanBytes(after[i]) + (before ? ' (after verify ' + humanBytes(before[i]) + ')' : '')];
      if (kv[i] !== null) lines.push('KV length: ' + T.committed + ' → ' + (T.committed + T.n) + ' → ' + kv[i]);
      lines.push('what changed: ' + changed(T, kind, kv[i]));
      cell.style.background = kind === 'GDN' ? C.GDN : C.attention;
      cell.setAttribute('data-layer', String(L[0]));
      cell.setAttribute('data-type', kind);
      cell.title = lines.join('\n');
      strip.appendChild(cell);
      total += after[i];
    });
    box.appendChild(strip);
    var kvs = kv.filter(function (v) { return v !== null; });
    var note = D.layers.length + ' layers, ' + humanBytes(total) + ' after the commit' +
      (kvs.length ? ' · attention KV length before → after verify → after commit: ' + T.committed + ' → ' +
       (T.committed + T.n) + ' → ' + kvs[0] : '') + ' · green: GDN, blue: attention · hover a layer for its details';
    box.appendChild(el('p', 'meta', note));
  }

  // ---- why the walk stopped (render/inspect_view.stop_html) -----------------------------------------------

  function stopLine(T) {
    var p = $('ddt-stop'), s = T.stop, depth = T.accepted.length, last = T.accepted[depth - 1];
    p.textContent = 'Round ' + (T.index + 1) + ' stopped at depth ' + depth + ' after node ' + last + ": target's token ";
    p.appendChild(tokCode(T.bonus));
    var rank = s[2] !== null && s[2] >= 0 ? ', drafter rank ' + s[2]
      : s[5] !== null ? ', drafter rank ' + s[5] + ' in its whole distribution' : '';
    p.appendChild(document.createTextNode((s[1] !== null ? ' (p ' + s[1].toFixed(4) + ')' : '') + rank + '; '));
    if (s[3] !== null) {
      p.appendChild(document.createTextNode("drafter's top candidate there "));
      p.appendChild(tokCode(s[3]));
      p.appendChild(document.createTextNode(' (' + s[4].toFixed(3) + '); '));
    } else {
      p.appendChild(document.createTextNode('no drafter candidate recorded there; '));
    }
    p.appendChild(el('b', 'ddt-reason', D.reasons[s[0]]));
    p.appendChild(document.createTextNode('.'));
  }

  // ---- the output so far against the reference (render/diff_view.py) ------------------------------------

  function sources(k) {  // diff_view.token_sources through round k: [kind, depth, round] per output token
    var out = [['prefill', null, null]];
    for (var j = 0; j <= k; j++) {
      var path = j >= FIRST ? D.steps[j - FIRST].a.length : 0;
      for (var t = 0; t < KEPT[j] && out.length < OUT.length; t++) {
        if (!path) out.push(['earlier', null, j]);
        else out.push(t < path - 1 ? ['draft', t + 1, j] : ['bonus', path, j]);
      }
    }
    return out;
  }

  function differs(i) {
    if (REF === null) return false;
    return i >= REF.length ? !M.pending : OUT[i] !== REF[i];
  }

  function summary(shown, first) {  // diff_view.compare_with_greedy's words
    var ref = M.reference;
    if (REF === null) return shown + ' tokens (no ' + (ref === 'greedy' ? 'greedy reference' : ref) + ')';
    if (M.invalid !== null) return 'comparison with ' + ref + ' INVALID: ' + M.invalid;
    if (first !== null) {
      return first === D.first_divergence ? M.summary : 'diverges at token ' + first + ' (' + ref + ' margin unknown)';
    }
    if (M.pending && REF.length < shown) {
      return 'identical to ' + ref + ' for the ' + REF.length + ' tokens checked so far; checking the other ' +
        (shown - REF.length) + '…';
    }
    return 'identical to ' + ref + ' for ' + shown + ' tokens';
  }

  function tokenSpan(i, src, first) {
    var f = document.createDocumentFragment(), ref = M.reference, choice = ref === 'greedy' ? 'argmax' : 'sample';
    var span = el('span', 'ddt-tok ddt-' + src[0], TOK[OUT[i]]), sub = {prefill: 'P', draft: 'd' + src[1], bonus: '★'};
    span.appendChild(el('sub', 'meta', sub[src[0]] || ''));
    var what = {prefill: "prefill token (the prefill pass's " + choice + ')', draft: 'accepted draft, depth ' + src[1],
                bonus: "bonus token (target's " + choice + '), depth ' + src[1]}[src[0]] || 'a round this file leaves out';
    var title = '#' + i + ' id ' + IDS[OUT[i]] + ': ' + what + (src[2] !== null ? ', round ' + (src[2] + 1) : '');
    span.setAttribute('data-index', String(i));
    f.appendChild(span);
    if (differs(i)) {
      var theirs = i < REF.length ? TOK[REF[i]] : '(' + ref + ' ended)';
      span.classList.add('ddt-differs');
      title += '; ' + ref + ' has ' + theirs;
      f.appendChild(el('span', 'ddt-greedy', '[' + ref + ': ' + theirs + ']'));
      if (i === first) {
        var margin = first === D.first_divergence && M.margin !== null ? M.margin.toFixed(3) : 'unknown';
        var badge = el('span', 'ddt-first', 'first divergence, ' + ref + ' margin ' + margin);
        badge.setAttribute('data-index', String(i));
        f.appendChild(badge);
        if (first === D.first_divergence && M.verdict) f.appendChild(el('span', 'meta', ' ' + M.verdict));
      }
    }
    span.title = title;
    return f;
  }

  function output(k) {
    var src = sources(k), shown = src.length, box = $('ddt-tokens'), first = null, lastRound = null;
    var compared = REF !== null && M.pending ? Math.min(shown, REF.length) : shown;
    for (var i = 0; REF !== null && i < compared; i++) if (differs(i)) { first = i; break; }
    box.textContent = '';
    src.forEach(function (s, i) {
      if (s[2] !== null && s[2] !== lastRound) {
        var sep = el('span', 'ddt-sep', '│');
        sep.title = 'round ' + (s[2] + 1);
        box.appendChild(sep);
      }
      lastRound = s[2];
      box.appendChild(tokenSpan(i, s, first));
    });
    var line = $('ddt-summary'), ok = REF !== null && first === null && M.invalid === null;
    line.textContent = summary(shown, first);
    line.style.color = ok ? '#1a7f37' : REF !== null ? C.diverge : '';
    line.style.fontWeight = 'bold';
    return {shown: shown, first: first};
  }

  // ---- stepping -----------------------------------------------------------------------------------------------

  function head(T, out) {
    var kept = KEPT[T.index], where = $('ddt-round-head');
    $('ddt-where').textContent = 'Round ' + (T.index + 1) + ' of ' + N + (FIRST > 0 || LAST < N - 1
      ? ' (this file: ' + (FIRST + 1) + '–' + (LAST + 1) + ')' : '');
    where.textContent = T.n + ' tree positions · accepted path ' + T.accepted.join(' → ') + ' (' +
      plural(T.accepted.length - 1, 'accepted draft') + ' + the bonus) · ' + plural(kept, 'token') +
      ' kept · output so far ' + plural(out.shown, 'token');
    where.setAttribute('data-nodes', String(T.n));
    where.setAttribute('data-accepted', JSON.stringify(T.accepted));
    where.setAttribute('data-divergence', out.first === null ? '' : String(out.first));
    $('ddt-prev').disabled = T.index <= FIRST;
    $('ddt-next').disabled = T.index >= LAST;
    $('ddt-slider').value = String(T.index + 1);
  }

  function setHash(k) {
    var h = '#round=' + (k + 1);
    if (location.hash === h) return;
    try { history.replaceState(null, '', h); } catch (e) { location.replace(h); }
  }

  var bars = clone(D.figures.acceptance.data);
  bars[0].x = KEPT.map(function (_, j) { return j + 1; });
  bars[0].y = KEPT;
  bars[0].hovertext = KEPT.map(function (v, j) { return 'round ' + (j + 1) + ': ' + plural(v, 'token') + ' kept'; });
  bars[0].hoverinfo = 'text';
  var accepted = Plotly.newPlot($('ddt-acceptance'), bars,
                                Object.assign(clone(D.figures.acceptance.layout), {template: D.figures.template}), CONFIG);

  function show(k) {
    k = Math.max(FIRST, Math.min(LAST, k));
    current = k;
    var mine = ++seq, T = round(k);
    document.body.removeAttribute('data-drawn');
    document.body.setAttribute('data-round', String(k + 1));
    var out = output(k);
    head(T, out);
    stopLine(T);
    cacheStrip(T);
    setHash(k);
    var tree = treeFigure(T), mask = maskFigure(T);
    var config = function (name) {
      return Object.assign({toImageButtonOptions: {format: 'svg', filename: 'ddtree-round' + (k + 1) + '-' + name}}, CONFIG);
    };
    var band = {type: 'rect', xref: 'x', yref: 'paper', x0: k + 0.5, x1: k + 1.5, y0: 0, y1: 1, layer: 'below',
                fillcolor: 'rgba(213,94,0,0.18)', line: {width: 0}};
    Promise.all([Plotly.react($('ddt-tree'), tree.data, tree.layout, config('tree')),
                 Plotly.react($('ddt-mask'), mask.data, mask.layout, config('mask')),
                 accepted.then(function (gd) { return Plotly.relayout(gd, {shapes: [band]}); })]).then(function () {
      if (mine === seq) document.body.setAttribute('data-drawn', String(k + 1));
    });
  }

  function hashRound() {
    var m = /^#round=(\d+)$/.exec(location.hash);
    return m ? parseInt(m[1], 10) - 1 : null;
  }

  function open() {
    var k = hashRound(), note = $('ddt-note');
    note.textContent = k !== null && (k < FIRST || k > LAST)
      ? 'Round ' + (k + 1) + ' is not in this file (it holds rounds ' + (FIRST + 1) + '–' + (LAST + 1) + ').' : '';
    show(k === null ? FIRST : k);
  }

  function go(k) {  // a step the reader took: the note about a missing round goes
    $('ddt-note').textContent = '';
    show(k);
  }

  document.addEventListener('keydown', function (e) {
    if (e.altKey || e.ctrlKey || e.metaKey || e.shiftKey) return;
    var t = e.target, tag = t && t.tagName;
    if (tag === 'INPUT' || tag === 'TEXTAREA' || tag === 'SELECT' || (t && t.isContentEditable)) return;
    var to = {ArrowLeft: current - 1, ArrowRight: current + 1, Home: FIRST, End: LAST}[e.key];
    if (to === undefined) return;
    e.preventDefault();
    if (to >= FIRST && to <= LAST && to !== current) go(to);
  });
  window.addEventListener('hashchange', function () { if (hashRound() !== current) open(); });
  $('ddt-prev').addEventListener('click', function () { go(current - 1); });
  $('ddt-next').addEventListener('click', function () { go(current + 1); });
  var slider = $('ddt-slider');
  slider.min = String(FIRST + 1);
  slider.max = String(LAST + 1);
  slider.addEventListener('input', function () { go(parseInt(slider.value, 10) - 1); });
  accepted.then(function (gd) {
    gd.on('plotly_click', function (ev) {
      var k = ev.points[0].x - 1;
      if (k >= FIRST && k <= LAST) go(k);
    });
  });
  window.ddtSupplement = {show: show, round: round, rows: rows, data: D, current: function () { return current; }};
  open();
})();
