// The Anthropic Messages API (/v1/messages, /v1/messages/count_tokens)
// through the official `@anthropic-ai/sdk` client, and raw fetch for the SSE
// event order, on the default model: the message shape and usage, greedy text
// equal to OpenAI chat's for the same messages (both render one template),
// system as a string and as text blocks, stop_sequences (stop_reason and the
// matched string), max_tokens, streaming (the SDK's stream helper rebuilds the
// non-streamed message; named events in Anthropic's order), count_tokens,
// tool_use / tool_result history, thinking, and errors in Anthropic's shape
// (400, 404, 401 with --api-key through x-api-key, 413).
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import Anthropic from '@anthropic-ai/sdk';
import { MODEL, SLOW, startServer, client, post, get } from './harness.mjs';

const MESSAGES = '/v1/messages';
const COUNT = '/v1/messages/count_tokens';

const anthropic = (base, opts = {}) => new Anthropic({
    baseURL: base, apiKey: 'x', maxRetries: 0, timeout: 60_000 * SLOW, ...opts,
});
const user = (content) => [{ role: 'user', content }];
// JSON round trip: the SDK's stream snapshot carries keys set to undefined
const plain = (o) => JSON.parse(JSON.stringify(o));
// what the two requests differ in: the id; parsed_output, which the SDK's stream adds
// the id differs per message, and so may the prefix-cache hit (the second run of a prompt reads it)
const withoutId = ({ id, parsed_output, usage, ...rest }) => {
    const { cache_read_input_tokens, ...u } = usage || {};
    return { ...rest, usage: u };
};

// The Anthropic error shape: {"type": "error", "error": {"type": str, "message": str}}.
function assertAnthropicError(res, status, type, what) {
    assert.equal(res.status, status, `${what}: status ${res.status}, want ${status}; body: ${res.text.slice(0, 300)}`);
    assert.ok((res.headers.get('content-type') || '').includes('application/json'), `${what}: content-type`);
    const j = res.json;
    assert.equal(j?.type, 'error', `${what}: ${res.text.slice(0, 300)}`);
    assert.equal(j.error?.type, type, `${what}: ${res.text.slice(0, 300)}`);
    assert.equal(typeof j.error.message, 'string', `${what}: ${res.text.slice(0, 300)}`);
    assert.ok(j.error.message.length > 0, `${what}: empty message`);
    return j.error;
}

// `event: <name>\ndata: <json>\n\n` frames; the name must equal data.type.
function parseEvents(text, what) {
    const frames = text.split('\n\n');
    assert.equal(frames.pop(), '', `${what}: trailing bytes after the last event`);
    return frames.map((f, i) => {
        const m = /^event: ([a-z_]+)\ndata: (.*)$/.exec(f);
        assert.ok(m, `${what}: event ${i} is not 'event: ...\\ndata: ...': ${JSON.stringify(f.slice(0, 200))}`);
        const data = JSON.parse(m[2]);
        assert.equal(data.type, m[1], `${what}: event ${i} named ${m[1]} has type ${data.type}`);
        return data;
    });
}

function checkMessage(m, maxTokens) {
    assert.match(m.id, /^msg_/, JSON.stringify(m));
    assert.equal(m.type, 'message');
    assert.equal(m.role, 'assistant');
    assert.equal(m.model, MODEL);
    assert.ok(Array.isArray(m.content), JSON.stringify(m));
    assert.ok(['end_turn', 'max_tokens', 'stop_sequence', 'tool_use'].includes(m.stop_reason), m.stop_reason);
    const u = m.usage;
    assert.ok(Number.isInteger(u.input_tokens) && u.input_tokens > 0, JSON.stringify(u));
    assert.ok(Number.isInteger(u.output_tokens) && u.output_tokens >= 0, JSON.stringify(u));
    // the prefix cache: a repeated prompt reads its full blocks back
    assert.ok(Number.isInteger(u.cache_read_input_tokens) && u.cache_read_input_tokens >= 0 &&
              u.cache_read_input_tokens < u.input_tokens, JSON.stringify(u));
    assert.equal(u.cache_creation_input_tokens, 0);
    if (maxTokens !== undefined) assert.ok(u.output_tokens <= maxTokens, JSON.stringify(u));
}

const textOf = (m) => m.content.filter((b) => b.type === 'text').map((b) => b.text).join('');

// A slice of t (3 bytes) whose first occurrence starts at index >= 4.
function pickStop(t) {
    for (let p = Math.floor(t.length / 2); p >= 4; p--) {
        const s = t.slice(p, p + 3);
        if (s.length === 3 && t.indexOf(s) >= 4) return s;
    }
    return null;
}

describe('anthropic API', { timeout: 300_000 * SLOW }, () => {
    let srv, api, oai;
    const create = (extra = {}) => api.messages.create({
        model: MODEL, max_tokens: 16, temperature: 0, messages: user('Tell me a story'), ...extra,
    });

    before(async () => {
        srv = await startServer();
        api = anthropic(srv.base);
        oai = client(srv.base);
    });
    after(async () => { if (srv && !srv.stopped) await srv.stop(); });

    it('messages.create: the message shape; text and usage equal OpenAI chat greedy output', async () => {
        const m = await create();
        checkMessage(m, 16);
        assert.equal(m.content.length, 1, JSON.stringify(m));
        assert.equal(m.content[0].type, 'text');
        assert.ok(m.content[0].text.length > 0);
        assert.equal(m.stop_sequence, null);
        const c = await oai.chat.completions.create({
            model: MODEL, max_tokens: 16, temperature: 0, messages: user('Tell me a story'),
        });
        assert.equal(m.content[0].text, c.choices[0].message.content);
        assert.equal(m.usage.input_tokens, c.usage.prompt_tokens);
        assert.equal(m.usage.output_tokens, c.usage.completion_tokens);
        assert.equal(m.stop_reason, c.choices[0].finish_reason === 'length' ? 'max_tokens' : 'end_turn');
    });

    it('system as a string and as text blocks renders as OpenAI system messages', async () => {
        const s = await create({ system: 'You are terse.' });
        const c = await oai.chat.completions.create({
            model: MODEL, max_tokens: 16, temperature: 0,
            messages: [{ role: 'system', content: 'You are terse.' }, ...user('Tell me a story')],
        });
        assert.equal(textOf(s), c.choices[0].message.content);
        assert.equal(s.usage.input_tokens, c.usage.prompt_tokens);
        const plainM = await create();
        assert.ok(s.usage.input_tokens > plainM.usage.input_tokens, 'the system prompt counts');
        const b = await create({ system: [{ type: 'text', text: 'You are ' }, { type: 'text', text: 'terse.' }] });
        assert.equal(textOf(b), textOf(s), 'text blocks join like OpenAI text parts');
        assert.equal(b.usage.input_tokens, s.usage.input_tokens);
        // content blocks in a user turn are text parts too
        const u = await create({ messages: user([{ type: 'text', text: 'Tell me ' }, { type: 'text', text: 'a story' }]) });
        assert.equal(textOf(u), textOf(plainM));
    });

    it('max_tokens ends with stop_reason "max_tokens"', async () => {
        const m = await create({ max_tokens: 2 });
        checkMessage(m, 2);
        assert.equal(m.stop_reason, 'max_tokens');
        assert.equal(m.usage.output_tokens, 2);
    });

    it('stop_sequences: stop_reason "stop_sequence", the matched string, the text before it', async () => {
        const full = textOf(await create({ max_tokens: 48 }));
        const stop = pickStop(full);
        assert.ok(stop, `no usable stop string in ${JSON.stringify(full)}`);
        const m = await create({ max_tokens: 48, stop_sequences: ['#never#', stop] });
        checkMessage(m, 48);
        assert.equal(m.stop_reason, 'stop_sequence');
        assert.equal(m.stop_sequence, stop, 'the string that matched (not the first listed)');
        assert.equal(textOf(m), full.slice(0, full.indexOf(stop)));
    });

    it('streaming: the SDK stream helper rebuilds the non-streamed message', async () => {
        const full = textOf(await create({ max_tokens: 48 }));
        const stop = pickStop(full);
        for (const extra of [{}, { max_tokens: 24, system: 'Be brief.' }, { max_tokens: 48, stop_sequences: [stop] }]) {
            const m = await create(extra);
            const stream = api.messages.stream({
                model: MODEL, max_tokens: 16, temperature: 0, messages: user('Tell me a story'), ...extra,
            });
            let deltas = '';
            stream.on('text', (t) => { deltas += t; });
            const f = await stream.finalMessage();
            assert.deepEqual(withoutId(plain(f)), withoutId(plain(m)), JSON.stringify(extra));
            assert.match(f.id, /^msg_/);
            assert.notEqual(f.id, m.id);
            assert.equal(deltas, textOf(m));
        }
    });

    it('streaming: raw events in Anthropic order, named as their type', async () => {
        const body = { model: MODEL, max_tokens: 12, temperature: 0, stream: true, messages: user('Tell me a story') };
        const r = await post(srv.base, MESSAGES, body);
        assert.equal(r.status, 200, r.text.slice(0, 300));
        assert.match(r.headers.get('content-type'), /^text\/event-stream/);
        const ev = parseEvents(r.text, 'stream');
        const types = ev.map((e) => e.type);
        assert.equal(types[0], 'message_start');
        assert.deepEqual(types.slice(-3), ['content_block_stop', 'message_delta', 'message_stop'], types.join(','));
        assert.equal(types[1], 'content_block_start');
        assert.ok(types.slice(2, -3).every((t) => t === 'content_block_delta'), types.join(','));
        const start = ev[0].message;
        assert.deepEqual(start.content, []);
        assert.equal(start.stop_reason, null);
        assert.ok(start.usage.input_tokens > 0);
        assert.deepEqual(ev[1], { type: 'content_block_start', index: 0, content_block: { type: 'text', text: '' } });
        for (const d of ev.slice(2, -3)) {
            assert.equal(d.index, 0);
            assert.equal(d.delta.type, 'text_delta');
        }
        assert.deepEqual(ev.at(-3), { type: 'content_block_stop', index: 0 });
        const md = ev.at(-2);
        assert.equal(md.delta.stop_reason, 'max_tokens');
        assert.equal(md.delta.stop_sequence, null);
        assert.equal(md.usage.output_tokens, 12);
        const m = await create({ max_tokens: 12 });
        assert.equal(ev.slice(2, -3).map((d) => d.delta.text).join(''), textOf(m));
        assert.equal(start.usage.input_tokens, m.usage.input_tokens);
    });

    it('count_tokens equals usage.input_tokens', async () => {
        const cases = [
            { messages: user('Tell me a story') },
            { system: 'You are terse.', messages: user('Tell me a story') },
            { messages: [...user('Hi'), { role: 'assistant', content: 'Hello!' }, ...user('Tell me a story')] },
        ];
        for (const c of cases) {
            const n = await api.messages.countTokens({ model: MODEL, ...c });
            const m = await create(c);
            assert.deepEqual(n, { input_tokens: m.usage.input_tokens }, JSON.stringify(c));
        }
        const r = await post(srv.base, COUNT, { model: MODEL, messages: 'nope' });
        assertAnthropicError(r, 400, 'invalid_request_error', 'count_tokens with bad messages');
    });

    it('tool_use and tool_result blocks in history, tools and tool_choice are accepted', async () => {
        const tools = [{
            name: 'get_weather', description: 'The weather in a city',
            input_schema: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] },
        }];
        const messages = [
            ...user('What is the weather in Paris?'),
            { role: 'assistant', content: [
                { type: 'text', text: 'Let me look.' },
                { type: 'tool_use', id: 'toolu_1', name: 'get_weather', input: { city: 'Paris' } },
            ] },
            { role: 'user', content: [
                { type: 'tool_result', tool_use_id: 'toolu_1', content: [{ type: 'text', text: 'Sunny, 21 C' }] },
                { type: 'tool_result', tool_use_id: 'toolu_2', content: 'n/a', is_error: true },
                { type: 'text', text: 'Thanks!' },
            ] },
            { role: 'assistant', content: [{ type: 'tool_use', id: 'toolu_3', name: 'get_weather', input: {} }] },
            { role: 'user', content: [{ type: 'tool_result', tool_use_id: 'toolu_3' }] },
        ];
        for (const tool_choice of [undefined, { type: 'auto' }, { type: 'none' }]) {
            const m = await create({ tools, messages, ...(tool_choice ? { tool_choice } : {}) });
            checkMessage(m, 16);
            const n = await api.messages.countTokens({ model: MODEL, tools, messages });
            assert.equal(n.input_tokens, m.usage.input_tokens);
        }
        // a thinking block in history is dropped; thinking on or off is a template variable
        const t = await create({
            thinking: { type: 'disabled' },
            messages: [...user('Hi'), { role: 'assistant', content: [{ type: 'thinking', thinking: 'hmm', signature: '' },
                { type: 'text', text: 'Hello!' }] }, ...user('Tell me a story')],
        });
        checkMessage(t, 16);
        checkMessage(await create({ thinking: { type: 'enabled', budget_tokens: 1024 } }), 16);
        const bad = await post(srv.base, MESSAGES, { model: MODEL, max_tokens: 4, messages: user([{ type: 'tool_result' }]) });
        assertAnthropicError(bad, 400, 'invalid_request_error', 'tool_result without tool_use_id');
        const badTool = await post(srv.base, MESSAGES, { model: MODEL, max_tokens: 4, messages: user('x'), tools: [{ name: 'x' }] });
        assertAnthropicError(badTool, 400, 'invalid_request_error', 'a tool without input_schema');
    });

    it('errors have Anthropic\'s shape and statuses', async () => {
        const noMax = await post(srv.base, MESSAGES, { model: MODEL, messages: user('hi') });
        assert.match(assertAnthropicError(noMax, 400, 'invalid_request_error', 'missing max_tokens').message, /max_tokens/);
        await assert.rejects(api.messages.create({ model: MODEL, messages: user('hi') }), (e) => {
            assert.ok(e instanceof Anthropic.BadRequestError, String(e));
            assert.equal(e.status, 400);
            assert.equal(e.error?.error?.type, 'invalid_request_error', JSON.stringify(e.error));
            return true;
        });
        const cases = [
            [{ max_tokens: 4, messages: user([{ type: 'image', source: { type: 'base64', media_type: 'image/png', data: '' } }]) }, /image/],
            [{ max_tokens: 4, messages: [{ role: 'system', content: 'x' }] }, /role/],
            [{ max_tokens: 4, messages: [] }, /messages/],
            [{ max_tokens: 4, messages: user('x'), stop_sequences: [''] }, /stop_sequences/],
            [{ max_tokens: 4, messages: user('x'), stop_sequences: 'x' }, /stop_sequences/],
            [{ max_tokens: 0, messages: user('x') }, /max_tokens/],
            [{ max_tokens: 4, messages: user('x'), temperature: 'hot' }, /temperature/],
            [{ max_tokens: 4, messages: user('x'), tool_choice: { type: 'sometimes' } }, /tool_choice/],
            [{ max_tokens: 4, messages: user('x'), thinking: { type: 'maybe' } }, /thinking/],
        ];
        for (const [body, re] of cases) {
            const r = await post(srv.base, MESSAGES, { model: MODEL, ...body });
            assert.match(assertAnthropicError(r, 400, 'invalid_request_error', JSON.stringify(body)).message, re);
        }
        const notJson = await post(srv.base, MESSAGES, '{"max_tokens": 4,');
        assertAnthropicError(notJson, 400, 'invalid_request_error', 'not JSON');
        const model = await post(srv.base, MESSAGES, { model: 'claude-x', max_tokens: 4, messages: user('x') });
        assertAnthropicError(model, 404, 'not_found_error', 'another model');
        const cmodel = await post(srv.base, COUNT, { model: 'claude-x', messages: user('x') });
        assertAnthropicError(cmodel, 404, 'not_found_error', 'count_tokens for another model');
        const method = await get(srv.base, MESSAGES);
        assertAnthropicError(method, 405, 'invalid_request_error', 'GET /v1/messages');
        const metrics = await get(srv.base, '/metrics');
        assert.match(metrics.text, /mlxcel_requests_total\{endpoint="\/v1\/messages",status="200"\} [1-9]/);
        assert.match(metrics.text, /mlxcel_requests_total\{endpoint="\/v1\/messages\/count_tokens",status="200"\} [1-9]/);
    });
});

describe('anthropic API with --api-key and --max-body', { timeout: 120_000 * SLOW }, () => {
    let srv;
    const key = 'sekret';
    before(async () => { srv = await startServer(['--api-key', key, '--max-body', '4096']); });
    after(async () => { if (srv && !srv.stopped) await srv.stop(); });

    it('a wrong x-api-key is 401 authentication_error; the right one works', async () => {
        const body = { model: MODEL, max_tokens: 4, messages: user('hi') };
        await assert.rejects(anthropic(srv.base, { apiKey: 'wrong' }).messages.create(body), (e) => {
            assert.ok(e instanceof Anthropic.AuthenticationError, String(e));
            assert.equal(e.status, 401);
            assert.equal(e.error?.type, 'error', JSON.stringify(e.error));
            assert.equal(e.error?.error?.type, 'authentication_error', JSON.stringify(e.error));
            return true;
        });
        for (const path of [MESSAGES, COUNT]) {
            const r = await post(srv.base, path, body, { headers: { 'x-api-key': 'wrong' } });
            assertAnthropicError(r, 401, 'authentication_error', `${path} with a wrong key`);
            const none = await post(srv.base, path, body);
            assertAnthropicError(none, 401, 'authentication_error', `${path} without a key`);
        }
        const m = await anthropic(srv.base, { apiKey: key }).messages.create(body);
        checkMessage(m, 4);
        // other routes keep OpenAI's shape
        const o = await post(srv.base, '/v1/chat/completions', body);
        assert.equal(o.status, 401);
        assert.equal(o.json.error.type, 'authentication_error');
        assert.ok('param' in o.json.error);
    });

    it('a body over --max-body is 413 in Anthropic\'s shape', async () => {
        const body = { model: MODEL, max_tokens: 4, messages: user('x'.repeat(8192)) };
        const r = await post(srv.base, MESSAGES, body, { headers: { 'x-api-key': key } });
        assertAnthropicError(r, 413, 'request_too_large', 'a large body');
    });
});
