// Structured output and tool calls through every dialect (docs/server.md, src/grammar): with
// constrained decoding even the tiny default model returns a well-formed call whose arguments
// validate against the tool's schema, streamed deltas assemble to the same call, a tool result is
// accepted back, and json_schema / json_object outputs parse and validate at temperature 1 over
// many seeds. The validator below covers the schema subset the tests use.
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import Anthropic from '@anthropic-ai/sdk';
import { startServer, client, post, MODEL, SLOW } from './harness.mjs';

const WEATHER = {
    type: 'object',
    properties: {
        city: { type: 'string', maxLength: 12 },
        days: { type: 'integer', minimum: 1, maximum: 7 },
        unit: { enum: ['C', 'F'] },
    },
    required: ['city', 'days'],
};
const TOOLS = [
    { type: 'function', function: { name: 'get_weather', description: 'the forecast', parameters: WEATHER } },
    { type: 'function', function: { name: 'get_time', parameters: { type: 'object', properties: { zone: { type: 'string', maxLength: 8 } }, required: ['zone'] } } },
];
const PERSON = {
    type: 'object',
    properties: {
        name: { type: 'string', minLength: 1, maxLength: 10 },
        age: { type: 'integer', minimum: 0, maximum: 120 },
        tags: { type: 'array', items: { enum: ['a', 'b', 'c'] }, maxItems: 3 },
        pet: { anyOf: [{ type: 'null' }, { type: 'object', properties: { kind: { enum: ['cat', 'dog'] } }, required: ['kind'], additionalProperties: false }] },
    },
    required: ['name', 'age', 'tags', 'pet'],
    additionalProperties: false,
};

// The subset of JSON Schema the tests use; returns an error string or null.
function validate(v, s, path = '$') {
    if (s.enum) return s.enum.some((e) => JSON.stringify(e) === JSON.stringify(v)) ? null : `${path}: not in enum`;
    if (s.anyOf) return s.anyOf.some((a) => validate(v, a, path) === null) ? null : `${path}: no anyOf matches`;
    const t = s.type;
    if (t === 'null') return v === null ? null : `${path}: not null`;
    if (t === 'string') {
        if (typeof v !== 'string') return `${path}: not a string`;
        const n = [...v].length;
        if (s.maxLength !== undefined && n > s.maxLength) return `${path}: longer than ${s.maxLength}`;
        if (s.minLength !== undefined && n < s.minLength) return `${path}: shorter than ${s.minLength}`;
        return null;
    }
    if (t === 'integer') {
        if (!Number.isInteger(v)) return `${path}: not an integer`;
        if (s.minimum !== undefined && v < s.minimum) return `${path}: below ${s.minimum}`;
        if (s.maximum !== undefined && v > s.maximum) return `${path}: above ${s.maximum}`;
        return null;
    }
    if (t === 'array') {
        if (!Array.isArray(v)) return `${path}: not an array`;
        if (s.maxItems !== undefined && v.length > s.maxItems) return `${path}: more than ${s.maxItems} items`;
        for (let i = 0; i < v.length; i++) { const e = validate(v[i], s.items, `${path}[${i}]`); if (e) return e; }
        return null;
    }
    if (t === 'object') {
        if (typeof v !== 'object' || v === null || Array.isArray(v)) return `${path}: not an object`;
        for (const k of s.required || []) if (!(k in v)) return `${path}: missing ${k}`;
        for (const [k, x] of Object.entries(v)) {
            const ps = (s.properties || {})[k];
            if (!ps) { if (s.additionalProperties === false) return `${path}: extra key ${k}`; continue; }
            const e = validate(x, ps, `${path}.${k}`);
            if (e) return e;
        }
        return null;
    }
    return null;
}

const USER = [{ role: 'user', content: 'What is the weather in Oslo this week?' }];

describe('structured output and tool calls', { timeout: 300_000 * SLOW }, () => {
    let srv, oa;
    before(async () => {
        srv = await startServer(['--parallel', '4']);
        oa = client(srv.base);
    });
    after(async () => { if (srv && !srv.stopped) await srv.stop(); });

    it('a named tool choice returns a call whose arguments validate (seeds 1..8, temperature 1)', async () => {
        for (let seed = 1; seed <= 8; seed++) {
            const r = await oa.chat.completions.create({ model: MODEL, messages: USER, tools: TOOLS, temperature: 1, seed,
                tool_choice: { type: 'function', function: { name: 'get_weather' } }, max_tokens: 120 });
            const c = r.choices[0];
            assert.equal(c.finish_reason, 'tool_calls', `seed ${seed}: ${JSON.stringify(c.message)}`);
            assert.equal(c.message.tool_calls.length, 1);
            const call = c.message.tool_calls[0];
            assert.equal(call.type, 'function');
            assert.equal(call.function.name, 'get_weather');
            assert.match(call.id, /^call_[A-Za-z0-9]{24}$/);
            const args = JSON.parse(call.function.arguments);
            assert.equal(validate(args, { ...WEATHER, additionalProperties: false }), null, `seed ${seed}: ${call.function.arguments}`);
        }
    });

    it('tool_choice required picks one of the tools; streamed deltas assemble to the same call', async () => {
        const body = { model: MODEL, messages: USER, tools: TOOLS, tool_choice: 'required', temperature: 1, seed: 11, max_tokens: 120 };
        const full = await oa.chat.completions.create(body);
        const want = full.choices[0].message.tool_calls[0];
        assert.ok(['get_weather', 'get_time'].includes(want.function.name));
        const stream = await oa.chat.completions.create({ ...body, stream: true });
        const calls = [];
        let finish = null, content = '';
        for await (const ch of stream) {
            const d = ch.choices[0]?.delta || {};
            if (d.content) content += d.content;
            for (const tc of d.tool_calls || []) {
                calls[tc.index] ??= { id: '', name: '', arguments: '' };
                if (tc.id) calls[tc.index].id = tc.id;
                if (tc.function?.name) calls[tc.index].name += tc.function.name;
                if (tc.function?.arguments) calls[tc.index].arguments += tc.function.arguments;
            }
            if (ch.choices[0]?.finish_reason) finish = ch.choices[0].finish_reason;
        }
        assert.equal(finish, 'tool_calls');
        assert.equal(content, '');
        assert.equal(calls.length, 1);
        assert.equal(calls[0].name, want.function.name);
        assert.deepEqual(JSON.parse(calls[0].arguments), JSON.parse(want.function.arguments));
    });

    it('a tool result is accepted back and the conversation goes on', async () => {
        const r = await oa.chat.completions.create({ model: MODEL, tools: TOOLS, temperature: 0, max_tokens: 8,
            messages: [...USER,
                { role: 'assistant', content: null, tool_calls: [{ id: 'call_1', type: 'function', function: { name: 'get_weather', arguments: '{"city":"Oslo","days":2}' } }] },
                { role: 'tool', tool_call_id: 'call_1', content: '12 C, rain' }] });
        assert.equal(r.choices[0].message.role, 'assistant');
        assert.ok(r.usage.completion_tokens >= 1);
    });

    it('json_schema and json_object outputs parse and validate at temperature 1 over many seeds', async () => {
        const fmt = { type: 'json_schema', json_schema: { name: 'person', schema: PERSON, strict: true } };
        const seeds = Array.from({ length: 12 }, (_, i) => i + 1);
        await Promise.all(seeds.map(async (seed) => {
            const r = await oa.chat.completions.create({ model: MODEL, messages: [{ role: 'user', content: 'Describe a person.' }],
                response_format: fmt, temperature: 1, seed, max_tokens: 200 });
            const c = r.choices[0];
            assert.equal(c.finish_reason, 'stop', `seed ${seed}: ${c.message.content}`);
            const v = JSON.parse(c.message.content);
            assert.equal(validate(v, PERSON), null, `seed ${seed}: ${c.message.content}`);
        }));
        // json_object bounds nothing (strings, keys), so a cut by max_tokens can leave it unfinished,
        // as with OpenAI; every output that ended by itself parses as an object
        let stopped = 0;
        for (const seed of [1, 2, 3, 4, 5, 6]) {
            const r = await oa.chat.completions.create({ model: MODEL, messages: [{ role: 'user', content: 'JSON please' }],
                response_format: { type: 'json_object' }, temperature: 1, seed, max_tokens: 300 });
            if (r.choices[0].finish_reason !== 'stop') continue;
            stopped++;
            const v = JSON.parse(r.choices[0].message.content);
            assert.ok(typeof v === 'object' && v !== null && !Array.isArray(v), r.choices[0].message.content);
        }
        assert.ok(stopped >= 1, 'no json_object output ended by itself');
    });

    it('unsupported or hostile schemas are a 400 naming the problem, quickly', async () => {
        const bad = [
            [{ type: 'string', pattern: '^a+$' }, /pattern/],
            [{ type: 'object', if: { type: 'object' } }, /if/],
            ['{"type":"object","properties":{"a":'.repeat(40) + '{}' + '}}'.repeat(40), /./],
            [JSON.stringify({ enum: Array.from({ length: 200_000 }, (_, i) => `v${i}`) }), /./],
            ['{"$ref":"#/$defs/a","$defs":{"a":{"$ref":"#/$defs/b"},"b":{"$ref":"#/$defs/a"}}}', /./],
        ];
        for (const [schema, re] of bad) {
            const t0 = Date.now();
            const s = typeof schema === 'string' ? schema : JSON.stringify(schema);
            const r = await post(srv.base, '/v1/chat/completions', `{"messages":${JSON.stringify(USER)},"max_tokens":4,` +
                `"response_format":{"type":"json_schema","json_schema":{"name":"x","schema":${s}}}}`);
            assert.equal(r.status, 400, r.text.slice(0, 300));
            assert.match(r.json.error.message, re);
            assert.ok(Date.now() - t0 < 10_000 * SLOW, 'too slow to refuse');
        }
    });

    it('Anthropic: a forced tool_use block with validated input; Responses: a function_call item', async () => {
        const an = new Anthropic({ baseURL: srv.base, apiKey: 'x', maxRetries: 0 });
        const m = await an.messages.create({ model: MODEL, max_tokens: 120, messages: USER, temperature: 1,
            tools: [{ name: 'get_weather', input_schema: WEATHER }], tool_choice: { type: 'tool', name: 'get_weather' } });
        assert.equal(m.stop_reason, 'tool_use', JSON.stringify(m.content));
        const use = m.content.find((b) => b.type === 'tool_use');
        assert.equal(use.name, 'get_weather');
        assert.match(use.id, /^toolu_01[A-Za-z0-9]{22}$/, 'Anthropic-style tool_use ids (issue 39 item 9)');
        assert.equal(validate(use.input, { ...WEATHER, additionalProperties: false }), null, JSON.stringify(use.input));
        const r = await oa.responses.create({ model: MODEL, input: 'weather in Oslo?', max_output_tokens: 120, temperature: 1,
            tools: [{ type: 'function', name: 'get_weather', parameters: WEATHER, strict: false }],
            tool_choice: { type: 'function', name: 'get_weather' } });
        const fc = r.output.find((o) => o.type === 'function_call');
        assert.ok(fc, JSON.stringify(r.output));
        assert.equal(fc.name, 'get_weather');
        assert.equal(validate(JSON.parse(fc.arguments), { ...WEATHER, additionalProperties: false }), null, fc.arguments);
    });

    // issue 39 item 2: 17 tools and tools whose parameters use $defs (as pydantic and zod emit) in a
    // forced call; each tool's "#/..." refs resolve against its own parameters
    const MANY = Array.from({ length: 17 }, (_, i) => ({ type: 'function', function: { name: `tool_${String.fromCharCode(97 + i)}`,
        parameters: { type: 'object', properties: { v: { $ref: '#/$defs/val' } }, required: ['v'], additionalProperties: false,
            $defs: { val: { type: 'integer', minimum: 10 * i, maximum: 10 * i + 5 } } } } }));
    const checkMany = (name, args, what) => {
        const k = MANY.findIndex((t) => t.function.name === name);
        assert.ok(k >= 0, `${what}: unknown tool ${name}`);
        assert.deepEqual(Object.keys(args), ['v'], what);
        assert.ok(Number.isInteger(args.v) && args.v >= 10 * k && args.v <= 10 * k + 5, `${what}: ${name} ${JSON.stringify(args)}`);
    };

    it('forced calls over 17 tools with $defs refs: chat required and named, Anthropic any and tool', async () => {
        for (let seed = 1; seed <= 6; seed++) {
            const r = await oa.chat.completions.create({ model: MODEL, messages: USER, tools: MANY, tool_choice: 'required',
                temperature: 1, seed, max_tokens: 60 });
            const c = r.choices[0];
            assert.equal(c.finish_reason, 'tool_calls', `seed ${seed}: ${JSON.stringify(c.message)}`);
            checkMany(c.message.tool_calls[0].function.name, JSON.parse(c.message.tool_calls[0].function.arguments), `seed ${seed}`);
        }
        const named = await oa.chat.completions.create({ model: MODEL, messages: USER, tools: MANY, temperature: 1, seed: 3,
            tool_choice: { type: 'function', function: { name: 'tool_q' } }, max_tokens: 60 });
        const call = named.choices[0].message.tool_calls[0];
        assert.equal(call.function.name, 'tool_q');
        checkMany('tool_q', JSON.parse(call.function.arguments), 'named');
        const an = new Anthropic({ baseURL: srv.base, apiKey: 'x', maxRetries: 0 });
        const atools = MANY.map((t) => ({ name: t.function.name, input_schema: t.function.parameters }));
        for (const tool_choice of [{ type: 'any' }, { type: 'tool', name: 'tool_p' }]) {
            // no seed in this API: each run draws anew, and the call (wrapper, name and number
            // spelled out by a 2048-id vocabulary) can take more than 60 tokens
            const m = await an.messages.create({ model: MODEL, max_tokens: 160, messages: USER, temperature: 1, tools: atools, tool_choice });
            assert.equal(m.stop_reason, 'tool_use', JSON.stringify(m.content));
            const use = m.content.find((b) => b.type === 'tool_use');
            if (tool_choice.name) assert.equal(use.name, tool_choice.name);
            checkMany(use.name, use.input, JSON.stringify(tool_choice));
        }
    });

    it('a tool schema that cannot be enforced is a 400 naming the tool path, not an internal anyOf', async () => {
        const tools = MANY.map((t, i) => i !== 3 ? t : { type: 'function', function: { name: 'bad',
            parameters: { type: 'object', properties: { x: { type: 'string', pattern: 'a+' } } } } });
        const r = await post(srv.base, '/v1/chat/completions', { messages: USER, tools, tool_choice: 'required', max_tokens: 4 });
        assert.equal(r.status, 400, r.text);
        assert.match(r.json.error.message, /tools\[3\]\.function\.parameters\.properties\.x/);
        assert.doesNotMatch(r.json.error.message, /anyOf/);
    });

    // issue 39 item 4: bounds are met exactly, or the schema is refused; never invalid output with stop
    it('numeric bounds at the edges validate; bounds that cannot be met are a 400', async () => {
        const BIG = { type: 'object', properties: { a: { type: 'integer', minimum: 1e15 }, b: { type: 'integer', maximum: -1e15 },
            c: { type: 'number', exclusiveMinimum: 0, exclusiveMaximum: 1e-9 } }, required: ['a', 'b', 'c'], additionalProperties: false };
        for (let seed = 1; seed <= 4; seed++) {
            const r = await oa.chat.completions.create({ model: MODEL, messages: USER, temperature: 1, seed, max_tokens: 120,
                response_format: { type: 'json_schema', json_schema: { name: 'b', schema: BIG } } });
            const c = r.choices[0];
            if (c.finish_reason !== 'stop') continue;
            const v = JSON.parse(c.message.content);
            assert.ok(Number.isInteger(v.a) && v.a >= 1e15 && Number.isInteger(v.b) && v.b <= -1e15 && v.c > 0 && v.c < 1e-9,
                `seed ${seed}: ${c.message.content}`);
        }
        // a document the grammar cannot finish (every completion nests deeper than it follows)
        // ends as cut short: finish_reason length, never stop
        const DEEP = { $defs: { a: { type: 'object', properties: { x: { $ref: '#/$defs/a' } }, required: ['x'], additionalProperties: false } },
            $ref: '#/$defs/a' };
        const deep = await oa.chat.completions.create({ model: MODEL, messages: USER, temperature: 0, max_tokens: 450,
            response_format: { type: 'json_schema', json_schema: { name: 'deep', schema: DEEP } } });
        assert.equal(deep.choices[0].finish_reason, 'length', deep.choices[0].message.content);
        assert.ok(deep.usage.completion_tokens < 450, `ended before max_tokens: ${deep.usage.completion_tokens}`);
        for (const schema of [{ type: 'integer', minimum: 9007199254740993 }, { type: 'number', minimum: 1e21 },
            { type: 'number', exclusiveMinimum: 0, exclusiveMaximum: 1e-300 }]) {
            const r = await post(srv.base, '/v1/chat/completions', { messages: USER, max_tokens: 4,
                response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'object', properties: { n: schema } } } } });
            assert.equal(r.status, 400, `${JSON.stringify(schema)}: ${r.text}`);
            assert.match(r.json.error.message, /\/properties\/n/);
        }
    });

    it('stops cleanly', async () => { await srv.stop(); });
});
