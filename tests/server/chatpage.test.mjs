// The chat page (GET /, src/server/chat.html) in a real browser: Debian's
// chromium, headless, driven by playwright-core, on 127.0.0.1 only.
// Checks: the page's headers (CSP, nosniff) and that it needs no API key; the
// page loads with no request other than to this server (route interception)
// and no script error or CSP violation; the model id comes from /v1/models;
// a message sent with Enter streams an answer that grows and ends equal to
// the same greedy request through the API; system prompt, temperature, max
// tokens and the conversation go into the request; Stop ends a long answer
// (the text stops growing, the next message works); user and model text with
// HTML in it shows as text (no element made from it, no handler run);
// reasoning_content lands folded in a <details>; with --api-key the page asks
// for the key and sends it as a bearer token; images: the Image button attaches a file (shown as
// a thumbnail, removable), the message goes as OpenAI content parts (image_url data: URL, then the
// text) and the answer equals `mlxcel generate --image` on an image-text checkpoint; a text
// model's 400 for an image shows and gives the text and the image back; a file that is not an
// image is refused on the page.
// chromium is installed by scripts/install-deps.sh (or MLXCEL_CHROMIUM=path);
// without it this FAILS, unless MLXCEL_SKIP_BROWSER=1 (then only the header
// checks run). MLXCEL_CHAT_SCREENSHOT=file.png saves a screenshot of a short
// chat (docs/chat-page.png is made that way).
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';
import { execFileSync } from 'node:child_process';
import { MODEL, SLOW, startServer, client, get, request, sleep } from './harness.mjs';

const CHROMIUM = process.env.MLXCEL_CHROMIUM || '/usr/bin/chromium';
const SKIP_BROWSER = process.env.MLXCEL_SKIP_BROWSER === '1';
const SCREENSHOT = process.env.MLXCEL_CHAT_SCREENSHOT;
const WAIT = 30_000 * SLOW;

const CSP = {
    'default-src': "'self'", 'script-src': "'unsafe-inline' 'self'", 'style-src': "'unsafe-inline'",
    'connect-src': "'self'", 'img-src': "'self' data:",
};

// A relay on 127.0.0.1 in front of a server that passes everything through,
// but hands a text/event-stream on one event at a time, `gapMs` apart: the
// page then sees an answer arrive over seconds however fast the model is (the
// browser's own network throttling proved unreliable for a loopback stream).
// Closing the page's side closes the upstream request, as a real client would.
function pacedRelay(target, gapMs) {
    const up = new URL(target);
    const server = http.createServer((req, res) => {
        // the Host the browser sent goes through (nginx: proxy_set_header Host $host), so the
        // page's Origin is the server's own (docs/server.md "Host, Origin and CORS")
        const fwd = http.request({ host: up.hostname, port: up.port, method: req.method, path: req.url,
            headers: { ...req.headers } }, (ures) => {
            res.writeHead(ures.statusCode, ures.headers);
            if (!/^text\/event-stream/.test(ures.headers['content-type'] || '')) return ures.pipe(res);
            let buf = '', queue = [], timer = null, ended = false, closed = false;
            const pump = () => {
                timer = null;
                if (closed)
                    return;
                if (queue.length) {
                    res.write(queue.shift());
                    timer = setTimeout(pump, gapMs);
                } else if (ended) res.end();
            };
            ures.setEncoding('utf8');
            ures.on('data', (d) => {
                buf += d;
                let i;
                while ((i = buf.indexOf('\n\n')) >= 0) { queue.push(buf.slice(0, i + 2)); buf = buf.slice(i + 2); }
                if (!timer) pump();
            });
            ures.on('end', () => { ended = true; if (buf) queue.push(buf); if (!timer) pump(); });
            ures.on('error', () => res.destroy());
            res.on('close', () => { closed = true; clearTimeout(timer); fwd.destroy(); });
        });
        fwd.on('error', () => res.destroy());
        req.pipe(fwd);
    });
    return new Promise((resolve) => server.listen(0, '127.0.0.1', () => resolve({
        base: `http://127.0.0.1:${server.address().port}`,
        stop: () => new Promise((r) => { server.closeAllConnections(); server.close(() => r()); }),
    })));
}

describe('chat page: headers', () => {
    let srv, keyed;
    before(async () => {
        srv = await startServer();
        keyed = await startServer(['--api-key', 'sekrit']);
    });
    after(async () => {
        if (srv) await srv.stop();
        if (keyed) await keyed.stop();
    });

    it('GET / -> 200 text/html with a strict CSP and nosniff; HEAD too; POST -> 405', async () => {
        const r = await get(srv.base, '/');
        assert.equal(r.status, 200);
        assert.equal(r.headers.get('content-type'), 'text/html; charset=utf-8');
        assert.equal(r.headers.get('x-content-type-options'), 'nosniff');
        const csp = Object.fromEntries((r.headers.get('content-security-policy') || '').split(';')
            .map((d) => d.trim().split(/\s+/)).filter((d) => d[0]).map(([k, ...v]) => [k, v.join(' ')]));
        for (const [k, v] of Object.entries(CSP)) assert.equal(csp[k], v, `CSP ${k}: ${JSON.stringify(csp)}`);
        assert.match(r.text, /^<!doctype html>/i);
        assert.ok(!/<(script|link|img|iframe)[^>]*\s(src|href)\s*=\s*["']?(https?:)?\/\//i.test(r.text),
            'the page references an external resource');
        const h = await request(srv.base, '/', { method: 'HEAD' });
        assert.equal(h.status, 200);
        assert.equal(h.text, '');
        const p = await request(srv.base, '/', { method: 'POST', body: '{}' });
        assert.equal(p.status, 405);
    });

    it('the page is served without the API key; the API still needs it', async () => {
        assert.equal((await get(keyed.base, '/')).status, 200);
        assert.equal((await get(keyed.base, '/v1/models')).status, 401);
    });
});

describe('chat page: in chromium', { skip: SKIP_BROWSER && 'MLXCEL_SKIP_BROWSER=1' }, () => {
    let srv, keyed, slow, vsrv, rsrv, vwork, browser, ctx, page;
    const external = [];       // requests to anything but our servers
    const problems = [];       // page errors, CSP violations
    const chatBodies = [];     // the JSON bodies the page POSTed to /v1/chat/completions
    const chatHeaders = [];

    before(async () => {
        if (!fs.existsSync(CHROMIUM))
            throw new Error(`chromium not found at ${CHROMIUM}: install it (scripts/install-deps.sh, ` +
                'apt-get install chromium), point MLXCEL_CHROMIUM at it, or set MLXCEL_SKIP_BROWSER=1 to skip');
        let chromium;
        try {
            ({ chromium } = await import('playwright-core'));
        } catch (e) {
            throw new Error(`cannot load playwright-core (npm ci in tests/server): ${e.message}`);
        }
        srv = await startServer();
        keyed = await startServer(['--api-key', 'sekrit']);
        slow = await pacedRelay(srv.base, 60);
        // an image-text checkpoint (the gemma3_vision golden with a tokenizer and a processor)
        vwork = fs.mkdtempSync(path.join(os.tmpdir(), 'mlxcel-chatpage-'));
        execFileSync('python3', ['tests/cli/make_vision_checkpoint.py', path.join(vwork, 'gemma3v')],
            { stdio: ['ignore', 'ignore', 'inherit'] });
        vsrv = await startServer(['-m', path.join(vwork, 'gemma3v')]);
        // router mode: the text model and the image-text one behind one server
        rsrv = await startServer(['-m', 'models/llama-tiny', '-m', `gemma3v=${path.join(vwork, 'gemma3v')}`]);
        browser = await chromium.launch({
            executablePath: CHROMIUM,
            args: ['--no-sandbox', '--disable-background-networking', '--disable-component-update',
                // resolve no name at all: nothing can leave the machine even if intercepted wrongly
                '--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1'],
        });
        ctx = await browser.newContext({ viewport: { width: 900, height: 640 } });
        const ours = [srv.base, keyed.base, slow.base, vsrv.base, rsrv.base].map((b) => new URL(b).origin);
        await ctx.route('**/*', (route) => {
            const req = route.request();
            const u = new URL(req.url());
            if (u.hostname !== '127.0.0.1' || !ours.includes(u.origin)) {
                external.push(req.url());
                return route.abort();
            }
            if (u.pathname === '/v1/chat/completions' && req.method() === 'POST') {
                chatBodies.push(JSON.parse(req.postData()));
                chatHeaders.push(req.headers());
            }
            return route.continue();
        });
        ctx.on('weberror', (e) => problems.push(`page error: ${e.error().message}`));
        ctx.on('console', (m) => {
            if (/Content Security Policy|Refused to/i.test(m.text())) problems.push(`console: ${m.text()}`);
        });
        page = await ctx.newPage();
    });

    after(async () => {
        if (browser) await browser.close().catch(() => {});
        if (slow) await slow.stop();
        if (srv) await srv.stop();
        if (keyed) await keyed.stop();
        if (vsrv) await vsrv.stop();
        if (rsrv) await rsrv.stop();
        if (vwork) fs.rmSync(vwork, { recursive: true, force: true });
    });

    const lastText = () => page.evaluate(() => {
        const all = document.querySelectorAll('#log .msg.assistant');
        const t = all.length ? all[all.length - 1].querySelector('.text') : null;
        return t ? t.textContent : '';
    });
    const idle = () => page.waitForFunction(() => document.getElementById('stop').disabled &&
        !document.querySelector('#log .msg.streaming'), null, { timeout: WAIT });
    async function send(text) {
        await page.fill('#input', text);
        await page.press('#input', 'Enter');
    }
    // Record the length of the last answer's text at each change of the log.
    const watch = () => page.evaluate(() => {
        window.__lens = [];
        new MutationObserver(() => {
            const all = document.querySelectorAll('#log .msg.assistant .text');
            if (all.length) window.__lens.push(all[all.length - 1].textContent.length);
        }).observe(document.getElementById('log'), { subtree: true, childList: true, characterData: true });
    });
    it('loads from this server only and shows the model id', async () => {
        await page.goto(srv.base + '/');
        await page.waitForFunction((m) => document.getElementById('model').textContent === m, MODEL, { timeout: WAIT });
        assert.equal(await page.title(), `${MODEL} · mlxcel`);
        // the page's icon is served (playwright neither reports the browser's own favicon
        // fetch nor lets a routed fetch of a URL ending in favicon.ico through: hence the query)
        const icon = await page.evaluate(async () => {
            const link = document.querySelector('link[rel=icon]');
            const r = link && await fetch(link.href + '?check');
            return r && { status: r.status, type: r.headers.get('content-type') };
        });
        assert.deepEqual(icon, { status: 200, type: 'image/svg+xml' });
        assert.deepEqual(external, []);
        assert.deepEqual(problems, []);
    });

    it('Enter sends; the answer streams, grows, and equals the greedy API answer', async () => {
        // from here on the page talks to the server through the paced relay
        await page.goto(slow.base + '/');
        await page.waitForFunction((m) => document.getElementById('model').textContent === m, MODEL, { timeout: WAIT });
        await page.click('#settings summary');
        await page.fill('#system', 'You are a poet.');
        await page.fill('#temperature', '0');
        await page.fill('#max-tokens', '40');
        await page.click('#settings summary');
        await watch();
        await send('ROMEO:');
        await page.waitForFunction(() => !document.getElementById('stop').disabled, null, { timeout: WAIT });
        assert.ok(await page.isDisabled('#send'), 'Send is enabled while streaming');
        await idle();
        const text = await lastText();
        const lens = await page.evaluate(() => window.__lens);
        const steps = [...new Set(lens.filter((n) => n > 0))];
        assert.ok(steps.length >= 2, `the answer did not grow in steps: lengths ${JSON.stringify(lens)}`);
        for (let i = 1; i < steps.length; i++) assert.ok(steps[i] > steps[i - 1], `the answer shrank: ${JSON.stringify(steps)}`);

        const body = chatBodies.at(-1);
        assert.equal(body.stream, true);
        assert.equal(body.model, MODEL);
        assert.equal(body.temperature, 0);
        assert.equal(body.max_tokens, 40);
        const messages = [{ role: 'system', content: 'You are a poet.' }, { role: 'user', content: 'ROMEO:' }];
        assert.deepEqual(body.messages, messages);
        const want = await client(srv.base).chat.completions.create({ model: MODEL, messages, temperature: 0, max_tokens: 40 });
        assert.equal(text, want.choices[0].message.content);
        assert.ok(text.length > 0);
        if (want.choices[0].finish_reason === 'length')
            assert.match(await page.textContent('#log .msg.assistant:last-child .meta'), /token limit/);

        await send('JULIET:');
        await idle();
        assert.deepEqual(chatBodies.at(-1).messages, [...messages, { role: 'assistant', content: text },
            { role: 'user', content: 'JULIET:' }], 'the conversation is sent with the next message');
        assert.ok((await lastText()).length > 0);
        if (SCREENSHOT) await page.screenshot({ path: SCREENSHOT });
        assert.deepEqual(external, []);
        assert.deepEqual(problems, []);
    });

    it('Stop ends a long answer; the next message still works', async () => {
        await page.click('#clear');
        await page.click('#settings summary');
        await page.fill('#max-tokens', '');          // up to the context: hundreds of tokens
        await page.fill('#temperature', '0');
        await page.click('#settings summary');
        await send('Tell me a long story.');
        await page.waitForFunction(() => {
            const t = document.querySelector('#log .msg.assistant .text');
            return t && t.textContent.length > 20;
        }, null, { timeout: WAIT });
        assert.ok(await page.isEnabled('#stop'));
        await page.click('#stop');
        await idle();
        const stopped = await lastText();
        assert.equal(await page.textContent('#log .msg.assistant:last-child .meta'), 'stopped');
        await sleep(1500);
        assert.equal(await lastText(), stopped, 'the text grew after Stop');
        assert.ok(await page.isEnabled('#send'));
        assert.equal(chatBodies.at(-1).max_tokens, undefined);

        await page.click('#settings summary');
        await page.fill('#max-tokens', '8');
        await page.click('#settings summary');
        await send('Again.');
        await idle();
        assert.deepEqual(chatBodies.at(-1).messages.slice(-2).map((m) => m.role), ['assistant', 'user'],
            'the stopped answer is kept in the conversation');
        assert.ok((await lastText()).length > 0, 'no answer after Stop');
        srv.assertAlive('after Stop');
    });

    it('HTML in user and model text is shown as text', async () => {
        await page.click('#clear');
        await page.evaluate(() => { window.__pwned = 0; });
        const evil = '<img src=x onerror="window.__pwned=1"><script>window.__pwned=2</script><b id="evil">b</b>';
        const evilModel = '<img src=y onerror="window.__pwned=3"><svg onload="window.__pwned=4"></svg>';
        const evilThought = '<script>window.__pwned=5</script><iframe src="javascript:alert(1)"></iframe>';
        // a canned stream for this one request: model text we choose, with reasoning
        const chunk = (delta, finish = null) => `data: ${JSON.stringify({
            id: 'x', object: 'chat.completion.chunk', created: 0, model: MODEL,
            choices: [{ index: 0, delta, finish_reason: finish }],
        })}\n\n`;
        await page.route('**/v1/chat/completions', (route) => route.fulfill({
            status: 200, contentType: 'text/event-stream',
            body: chunk({ role: 'assistant', content: '' }) + chunk({ reasoning_content: evilThought }) +
                chunk({ reasoning_content: ' more thought' }) + chunk({ content: evilModel }) +
                chunk({ content: ' tail' }) + chunk({}, 'stop') + 'data: [DONE]\n\n',
        }), { times: 1 });
        await send(evil);
        await idle();
        assert.equal(await page.textContent('#log .msg.user .text'), evil);
        assert.equal(await lastText(), evilModel + ' tail');
        const det = await page.evaluate(() => {
            const d = document.querySelector('#log .msg.assistant details.reasoning');
            return d && { open: d.open, text: d.querySelector('.rtext').textContent };
        });
        assert.deepEqual(det, { open: false, text: evilThought + ' more thought' }, 'reasoning is folded in a <details>');
        await sleep(300);
        const made = await page.evaluate(() =>
            document.querySelectorAll('#log img, #log script, #log svg, #log iframe, #log b, #evil').length);
        assert.equal(made, 0, 'elements were made from message text');
        assert.equal(await page.evaluate(() => window.__pwned), 0, 'a handler in message text ran');
        assert.deepEqual(external, []);
        assert.deepEqual(problems, []);
    });

    it('with --api-key: the page asks for the key and sends it as a bearer token', async () => {
        const p = await ctx.newPage();
        try {
            await p.goto(keyed.base + '/');
            await p.waitForFunction(() => /API key/.test(document.getElementById('status').textContent), null, { timeout: WAIT });
            assert.ok(await p.evaluate(() => document.getElementById('settings').open), 'the settings are not opened');
            await p.fill('#key', 'sekrit');
            await p.dispatchEvent('#key', 'change');
            await p.waitForFunction((m) => document.getElementById('model').textContent === m, MODEL, { timeout: WAIT });
            await p.fill('#max-tokens', '8');
            await p.fill('#input', 'Hello');
            await p.press('#input', 'Enter');
            await p.waitForFunction(() => document.getElementById('stop').disabled &&
                (document.querySelector('#log .msg.assistant .text')?.textContent.length > 0), null, { timeout: WAIT });
            assert.equal(chatHeaders.at(-1).authorization, 'Bearer sekrit');
            assert.equal(await p.textContent('#status'), '');
        } finally {
            await p.close();
        }
        assert.deepEqual(external, []);
        assert.deepEqual(problems, []);
    });

    it('images: attach, thumbnail, content parts; the answer equals generate --image', async () => {
        const IMG = 'tests/fixtures/images/vis_photo.jpg';
        const TEXT = 'w10 w20 w30';
        const want = execFileSync(process.env.MLXCEL_BIN, ['generate', '-m', path.join(vwork, 'gemma3v'),
            '--image', IMG, '-p', TEXT, '-n', '6', '--temp', '0'], { encoding: 'utf8' }).replace(/\n$/, '');
        await page.goto(vsrv.base + '/');
        await page.waitForFunction(() => document.getElementById('model').textContent === 'gemma3v', null, { timeout: WAIT });
        assert.ok(await page.isVisible('#attach'), 'no Image button');
        await page.click('#settings summary');
        await page.fill('#system', '');
        await page.fill('#temperature', '0');
        await page.fill('#max-tokens', '6');
        await page.click('#settings summary');
        // two files attached, one removed again
        await page.setInputFiles('#file', [IMG, 'tests/fixtures/images/vis_edges.png']);
        await page.waitForFunction(() => document.querySelectorAll('#attached img').length === 2, null, { timeout: WAIT });
        await page.click('#attached .thumb:nth-child(2) button');
        assert.equal(await page.evaluate(() => document.querySelectorAll('#attached img').length), 1);
        await send(TEXT);
        await idle();
        assert.equal(await lastText(), want);
        const url = `data:image/jpeg;base64,${fs.readFileSync(IMG).toString('base64')}`;
        assert.deepEqual(chatBodies.at(-1).messages, [{ role: 'user', content: [
            { type: 'image_url', image_url: { url } }, { type: 'text', text: TEXT }] }]);
        const shown = await page.evaluate(() => [...document.querySelectorAll('#log .msg.user .images img')]
            .map((i) => ({ data: i.src.startsWith('data:image/jpeg;base64,'), loaded: i.complete && i.naturalWidth > 0 })));
        assert.deepEqual(shown, [{ data: true, loaded: true }], 'the message does not show its image');
        assert.equal(await page.evaluate(() => document.querySelectorAll('#attached img').length), 0,
            'the sent image is still attached');
        // the next turn resends the conversation with its image
        await send('w40');
        await idle();
        const msgs = chatBodies.at(-1).messages;
        assert.equal(msgs.length, 3);
        assert.deepEqual(msgs[0].content[0], { type: 'image_url', image_url: { url } });
        assert.deepEqual(external, []);
        assert.deepEqual(problems, [], 'CSP violations or page errors (img-src for the thumbnails)');
    });

    it('images: a text model refuses one (text and image given back); a non-image is refused', async () => {
        await page.goto(srv.base + '/');
        await page.waitForFunction((m) => document.getElementById('model').textContent === m, MODEL, { timeout: WAIT });
        await page.setInputFiles('#file', { name: 'notes.txt', mimeType: 'text/plain', buffer: Buffer.from('hello') });
        await page.waitForFunction(() => /not a PNG, JPEG, WebP or GIF/.test(document.getElementById('status').textContent),
            null, { timeout: WAIT });
        assert.equal(await page.evaluate(() => document.querySelectorAll('#attached img').length), 0);
        await page.setInputFiles('#file', 'tests/fixtures/images/vis_edges.png');
        await page.waitForFunction(() => document.querySelectorAll('#attached img').length === 1, null, { timeout: WAIT });
        await send('Describe it.');
        await idle();
        const meta = await page.textContent('#log .msg.assistant:last-child .meta');
        assert.match(meta, new RegExp(MODEL), `the error does not name the model: ${meta}`);
        assert.match(meta, /image/i);
        assert.equal(await page.inputValue('#input'), 'Describe it.', 'the text was not given back');
        assert.equal(await page.evaluate(() => document.querySelectorAll('#attached img').length), 1,
            'the image was not given back');
        await page.click('#clear');
        assert.equal(await page.evaluate(() => document.querySelectorAll('#attached img').length), 0);
        assert.deepEqual(external, []);
        assert.deepEqual(problems, []);
    });

    it('router mode: a menu of the models; the Image button follows the chosen one\'s /props', async () => {
        await page.goto(rsrv.base + '/');
        await page.waitForFunction(() => !document.getElementById('models').hidden &&
            document.getElementById('models').options.length === 2, null, { timeout: WAIT });
        const opts = await page.evaluate(() => [...document.getElementById('models').options].map((o) => o.value));
        assert.deepEqual(opts.sort(), ['gemma3v', 'llama-tiny']);
        await page.selectOption('#models', 'gemma3v');
        await page.waitForFunction(() => document.getElementById('model').textContent === 'gemma3v' &&
            !document.getElementById('attach').hidden, null, { timeout: WAIT });
        await page.selectOption('#models', 'llama-tiny');
        await page.waitForFunction(() => document.getElementById('model').textContent === 'llama-tiny' &&
            document.getElementById('attach').hidden, null, { timeout: WAIT });
        // A late answer (the router loading a model before it answers) must not overwrite the
        // choice made since: /props for llama-tiny is held while gemma3v is chosen.
        let held = 0, released = 0;
        const late = (u) => u.pathname === '/props' && u.searchParams.get('model') === 'llama-tiny';
        await page.route(late, async (route) => {
            held++;
            await sleep(1500);
            released++;
            await route.fallback();
        });
        await page.selectOption('#models', 'gemma3v');
        await page.selectOption('#models', 'llama-tiny');
        await page.selectOption('#models', 'gemma3v');
        await page.waitForFunction(() => document.getElementById('model').textContent === 'gemma3v' &&
            !document.getElementById('attach').hidden, null, { timeout: WAIT });
        const t0 = Date.now();
        while (released < held && Date.now() - t0 < WAIT) await sleep(50);
        assert.equal(held, 1);
        assert.equal(released, held);
        await sleep(300);
        assert.equal(await page.evaluate(() => document.getElementById('attach').hidden), false,
            'a late /props answer for llama-tiny hid the Image button of gemma3v');
        await page.unroute(late);
        await page.selectOption('#models', 'llama-tiny');
        await page.waitForFunction(() => document.getElementById('model').textContent === 'llama-tiny' &&
            document.getElementById('attach').hidden, null, { timeout: WAIT });
        await page.click('#settings summary');
        await page.fill('#max-tokens', '6');
        await page.click('#settings summary');
        await send('ROMEO:');
        await idle();
        assert.equal(chatBodies.at(-1).model, 'llama-tiny');
        assert.ok((await lastText()).length > 0);
        assert.deepEqual(external, []);
        assert.deepEqual(problems, []);
    });
});
