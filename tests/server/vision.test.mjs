// Images through the server's APIs (issue 43 item 4, ADR 0090), on an image-text checkpoint made
// at run time from the gemma3_vision golden (tests/cli/make_vision_checkpoint.py: tokenizer,
// Gemma 3's chat template, image processor at the tiny tower's 64 x 64):
//  - the official `openai` client's chat image_url part (a base64 data: URL), the Responses
//    API's input_image and the `@anthropic-ai/sdk` client's base64 image block all give what
//    `mlxcel generate --image` gives for the same image and text, and count the image's tokens
//    in usage (27 prompt tokens: 3 of text, boi + 16 image tokens + eoi, the template's 6);
//  - the prefix cache: the same image again reads the cached blocks, another image with the
//    same text does not;
//  - hostile images (truncated, wrong magic, 0 bytes, a 60000 x 60000 header, not base64) and
//    http(s) URLs are 400s in each API's error shape, and the server keeps serving;
//  - a text model (llama-tiny) answers an image part with a 400 naming the model;
//  - per family (the golden checkpoints below), the scheduler's answers equal generate --image's,
//    two images in one message too (Qwen2-VL, LLaVA), Idefics3 / SmolVLM tiles beside text requests;
//  - `serve --allow-image-urls`: an http URL (a local server's) is fetched, redirects followed up
//    to 3, and nothing of the client's request (its Authorization) forwarded; a 404, a redirect
//    loop, a body over 20 MiB, a server that never answers (10 s) and a non-http URL are 400s.
import { describe, it, before, after } from 'node:test';
import { createServer } from 'node:http';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import Anthropic from '@anthropic-ai/sdk';
import { MODEL, SLOW, startServer, client, post, assertError } from './harness.mjs';

const BIN = process.env.MLXCEL_BIN;
const work = mkdtempSync(join(tmpdir(), 'mlxcel-vision-'));
const ck = join(work, 'gemma3v');
process.on('exit', () => rmSync(work, { recursive: true, force: true }));
if (BIN) execFileSync('python3', ['tests/cli/make_vision_checkpoint.py', ck], { stdio: ['ignore', 'ignore', 'inherit'] });
const IMG = 'tests/fixtures/images';
const b64 = (f) => readFileSync(join(IMG, f)).toString('base64');
const dataUrl = (f, type = 'image/jpeg') => `data:${type};base64,${b64(f)}`;
const TEXT = 'w10 w20 w30';
const N = 6;
const PROMPT_TOKENS = 27;

// what `mlxcel generate --image` writes for the same image and text (greedy)
const cli = (f) => execFileSync(BIN, ['generate', '-m', ck, '--image', join(IMG, f), '-p', TEXT, '-n', String(N),
    '--temp', '0'], { encoding: 'utf8' }).replace(/\n$/, '');
const chatBody = (url, extra = {}, text = TEXT) => ({
    model: 'gemma3v', max_tokens: N, temperature: 0,
    messages: [{ role: 'user', content: [{ type: 'image_url', image_url: { url } }, { type: 'text', text }] }],
    ...extra,
});
// Two images in one user message (the chat template places both, then the text) against
// `generate --image A --image B -p text`: the scheduler encodes one image a step, so the chunk
// that stops before the second image holds the first's rows (once fed as the image token's
// embedding instead: other tokens on every family).
const twoImages = async (oai, model, dir, text) => {
    const want = execFileSync(BIN, ['generate', '-m', dir, '--image', join(IMG, 'vis_photo.jpg'), '--image',
        join(IMG, 'vis_edges.png'), '-p', text, '-n', String(N), '--temp', '0'], { encoding: 'utf8' }).replace(/\n$/, '');
    const r = await oai.chat.completions.create({
        model, max_tokens: N, temperature: 0,
        messages: [{ role: 'user', content: [{ type: 'image_url', image_url: { url: dataUrl('vis_photo.jpg') } },
            { type: 'image_url', image_url: { url: dataUrl('vis_edges.png', 'image/png') } }, { type: 'text', text }] }],
    });
    assert.equal(r.choices[0].message.content, want);
};
const anthropic = (base) => new Anthropic({ baseURL: base, apiKey: 'x', maxRetries: 0, timeout: 60_000 * SLOW });

describe('vision: images through the APIs', () => {
    let srv, oai;
    before(async () => {
        srv = await startServer(['-m', ck]);
        oai = client(srv.base);
    });
    after(async () => { await srv?.stop(); });

    it('openai chat: an image_url data: URL equals generate --image; the image counts in usage', async () => {
        const want = cli('vis_photo.jpg');
        const r = await oai.chat.completions.create(chatBody(dataUrl('vis_photo.jpg')));
        assert.equal(r.choices[0].message.content, want);
        assert.equal(r.usage.prompt_tokens, PROMPT_TOKENS);
        // PNG too, and a streamed answer with usage
        const wantPng = cli('vis_edges.png');
        const s = await oai.chat.completions.create({ ...chatBody(dataUrl('vis_edges.png', 'image/png')), stream: true,
            stream_options: { include_usage: true } });
        let text = '', usage;
        for await (const c of s) {
            text += c.choices[0]?.delta?.content || '';
            if (c.usage) usage = c.usage;
        }
        assert.equal(text, wantPng);
        assert.equal(usage.prompt_tokens, PROMPT_TOKENS);
    });

    it('responses: input_image equals generate --image', async () => {
        const r = await oai.responses.create({
            model: 'gemma3v', max_output_tokens: N, temperature: 0,
            input: [{ role: 'user', content: [{ type: 'input_image', image_url: dataUrl('photo.webp', 'image/webp') },
                { type: 'input_text', text: TEXT }] }],
        });
        assert.equal(r.output_text, cli('photo.webp'));
        assert.equal(r.usage.input_tokens, PROMPT_TOKENS);
    });

    it('anthropic: a base64 image block equals generate --image', async () => {
        const r = await anthropic(srv.base).messages.create({
            model: 'gemma3v', max_tokens: N, temperature: 0,
            messages: [{ role: 'user', content: [
                { type: 'image', source: { type: 'base64', media_type: 'image/gif', data: b64('edges.gif') } },
                { type: 'text', text: TEXT }] }],
        });
        assert.equal(r.content[0].text, cli('edges.gif'));
        assert.equal(r.usage.input_tokens + (r.usage.cache_read_input_tokens || 0), PROMPT_TOKENS);
    });

    it('prefix cache: the same image shares the cached prefix, another image does not', async () => {
        // 44 prompt tokens: the image (rows 4 .. 19) lies inside the first two blocks of 16, a hit
        // (which never ends inside an image) can reach row 32
        const long = Array.from({ length: 20 }, (_, i) => `w${40 + i}`).join(' ');
        const a = await post(srv.base, '/v1/chat/completions', chatBody(dataUrl('wide.jpg'), {}, long));
        assert.equal(a.status, 200, a.text);
        assert.equal(a.json.usage.prompt_tokens, 44);
        assert.equal(a.json.usage.prompt_tokens_details.cached_tokens, 0);
        const b = await post(srv.base, '/v1/chat/completions', chatBody(dataUrl('wide.jpg'), {}, long));
        assert.equal(b.json.usage.prompt_tokens_details.cached_tokens, 32, JSON.stringify(b.json.usage));
        assert.equal(b.json.choices[0].message.content, a.json.choices[0].message.content);
        // the same text with another image (never sent): none of the image's blocks are shared
        const c = await post(srv.base, '/v1/chat/completions', chatBody(dataUrl('photo_444.jpg'), {}, long));
        assert.equal(c.json.usage.prompt_tokens_details.cached_tokens, 0, JSON.stringify(c.json.usage));
    });

    it('hostile images and URLs are 400s; the server keeps serving', async () => {
        const bad = [
            ['truncated.png', dataUrl('truncated.png', 'image/png'), /truncated|ends/],
            ['wrong magic', dataUrl('wrong_magic.jpg'), /image/],
            ['0 bytes', 'data:image/png;base64,', /empty/],
            ['60000 x 60000 header', dataUrl('huge_header.png', 'image/png'), /limit/],
            ['garbage', dataUrl('garbage.bin'), /image/],
            ['not base64', 'data:image/png;base64,@@@@', /base64/],
            ['not a data: URL', 'file:///etc/passwd', /data: URL/],
            ['https', 'https://example.com/cat.png', /--allow-image-urls/],
        ];
        for (const [what, url, re] of bad) {
            const r = await post(srv.base, '/v1/chat/completions', chatBody(url));
            const e = assertError(r, 400, what, { param: 'messages[0].content[0].image_url.url' });
            assert.match(e.message, re, what);
            srv.assertAlive(what);
        }
        const an = await post(srv.base, '/v1/messages', {
            model: 'gemma3v', max_tokens: 2, messages: [{ role: 'user', content: [
                { type: 'image', source: { type: 'base64', media_type: 'image/png', data: b64('truncated.png') } }] }],
        });
        assert.equal(an.status, 400, an.text);
        assert.equal(an.json.type, 'error');
        assert.equal(an.json.error.type, 'invalid_request_error');
        // image tokens typed as text are no image
        const typed = await post(srv.base, '/v1/chat/completions', { max_tokens: 2,
            messages: [{ role: 'user', content: 'w5 <image_soft_token>' }] });
        assertError(typed, 400, 'image tokens as text');
        const ok = await oai.chat.completions.create(chatBody(dataUrl('vis_photo.jpg')));
        assert.equal(ok.choices[0].message.content, cli('vis_photo.jpg'));
    });
});

// Qwen2-VL (images of their own size, M-RoPE; ADR 0094, 0095): the qwen2_vl golden checkpoint
// (its tokenizer, chat template and image processor). The messages are the golden's (text, then
// the image), so the chat template renders transformers' prompt, whose greedy steps all have
// clear margins: the openai (chat, responses) and anthropic clients' answers equal `mlxcel generate --image` of
// that rendered prompt (tests/cli/qwen_vl.sh: transformers' greedy ids), the image's rows
// count in usage, and the prefix cache keys the image's blocks by its content (and grid).
describe('vision: Qwen2-VL', () => {
    const QG = 'tests/fixtures/golden/qwen2_vl';
    const gold = BIN ? JSON.parse(readFileSync(join(QG, 'golden.json'), 'utf8')) : {};
    const QTEXT = 'Describe this picture.';
    let want;
    let srv, oai;
    before(async () => {
        const pf = join(work, 'qwen2_vl.prompt');
        writeFileSync(pf, gold.prompt);
        want = execFileSync(BIN, ['generate', '-m', QG, '--image', join(IMG, 'vis_photo.jpg'), '-f', pf, '--no-chat',
            '-n', String(N), '--temp', '0'], { encoding: 'utf8' }).replace(/\n$/, '');
        srv = await startServer(['-m', QG]);
        oai = client(srv.base);
    });
    after(async () => { await srv?.stop(); });

    it('openai chat: the image_url part gives transformers\' answer; its rows count in usage', async () => {
        const r = await oai.chat.completions.create({
            model: 'qwen2_vl', max_tokens: N, temperature: 0,
            messages: [{ role: 'user', content: [{ type: 'text', text: QTEXT },
                { type: 'image_url', image_url: { url: dataUrl('vis_photo.jpg') } }] }],
        });
        assert.equal(r.choices[0].message.content, want);
        assert.equal(r.usage.prompt_tokens, gold.input_ids.length);
        // the same image again: its blocks come from the prefix cache, the answer is the same;
        // another image after the same text: the cache stops before the image's rows
        const again = await oai.chat.completions.create({
            model: 'qwen2_vl', max_tokens: N, temperature: 0,
            messages: [{ role: 'user', content: [{ type: 'text', text: QTEXT },
                { type: 'image_url', image_url: { url: dataUrl('vis_photo.jpg') } }] }],
        });
        assert.equal(again.choices[0].message.content, want);
        const first = gold.input_ids.indexOf(gold.image_token_id);
        assert.ok(again.usage.prompt_tokens_details.cached_tokens > first);
        const other = await oai.chat.completions.create({
            model: 'qwen2_vl', max_tokens: N, temperature: 0,
            messages: [{ role: 'user', content: [{ type: 'text', text: QTEXT },
                { type: 'image_url', image_url: { url: dataUrl('vis_edges.png', 'image/png') } }] }],
        });
        assert.ok(other.usage.prompt_tokens_details.cached_tokens <= first);
    });

    it('two images in one message equal generate --image A --image B', () => twoImages(oai, 'qwen2_vl', QG, QTEXT));

    it('responses: input_image gives the same', async () => {
        const r = await oai.responses.create({
            model: 'qwen2_vl', max_output_tokens: N, temperature: 0,
            input: [{ role: 'user', content: [{ type: 'input_text', text: QTEXT },
                { type: 'input_image', image_url: dataUrl('vis_photo.jpg') }] }],
        });
        assert.equal(r.output_text, want);
    });

    it('anthropic: a base64 image block gives the same', async () => {
        const r = await anthropic(srv.base).messages.create({
            model: 'qwen2_vl', max_tokens: N, temperature: 0,
            messages: [{ role: 'user', content: [{ type: 'text', text: QTEXT },
                { type: 'image', source: { type: 'base64', media_type: 'image/jpeg', data: b64('vis_photo.jpg') } }] }],
        });
        assert.equal(r.content[0].text, want);
    });
});

// Qwen3-VL (DeepStack, interleaved M-RoPE; ADR 0120): the qwen3_vl golden checkpoint through the
// scheduler, whose steps carry each image's deepstack planes: the openai and anthropic clients'
// answers equal `mlxcel generate --image` of the golden's rendered prompt (tests/cli/qwen_vl.sh:
// transformers' greedy ids), two requests at once included (one image prompt, one text).
describe('vision: Qwen3-VL', { skip: BIN && !existsSync('tests/fixtures/golden/qwen3_vl/golden.json') &&
    'no qwen3_vl golden case' }, () => {
    const Q3 = 'tests/fixtures/golden/qwen3_vl';
    const gold = BIN ? JSON.parse(readFileSync(join(Q3, 'golden.json'), 'utf8')) : {};
    const QTEXT = 'Describe this picture.';
    let want;
    let srv, oai;
    before(async () => {
        const pf = join(work, 'qwen3_vl.prompt');
        writeFileSync(pf, gold.prompt);
        want = execFileSync(BIN, ['generate', '-m', Q3, '--image', join(IMG, 'vis_photo.jpg'), '-f', pf, '--no-chat',
            '-n', String(N), '--temp', '0'], { encoding: 'utf8' }).replace(/\n$/, '');
        srv = await startServer(['-m', Q3]);
        oai = client(srv.base);
    });
    after(async () => { await srv?.stop(); });

    const ask = () => oai.chat.completions.create({
        model: 'qwen3_vl', max_tokens: N, temperature: 0,
        messages: [{ role: 'user', content: [{ type: 'text', text: QTEXT },
            { type: 'image_url', image_url: { url: dataUrl('vis_photo.jpg') } }] }],
    });

    it('openai chat: the image_url part gives transformers\' answer, also beside a text request', async () => {
        const r = await ask();
        assert.equal(r.choices[0].message.content, want);
        assert.equal(r.usage.prompt_tokens, gold.input_ids.length);
        const [a, t] = await Promise.all([ask(), oai.chat.completions.create({
            model: 'qwen3_vl', max_tokens: N, temperature: 0, messages: [{ role: 'user', content: QTEXT }] })]);
        assert.equal(a.choices[0].message.content, want);
        assert.ok(t.usage.completion_tokens > 0);
    });

    it('anthropic: a base64 image block gives the same', async () => {
        const r = await anthropic(srv.base).messages.create({
            model: 'qwen3_vl', max_tokens: N, temperature: 0,
            messages: [{ role: 'user', content: [{ type: 'text', text: QTEXT },
                { type: 'image', source: { type: 'base64', media_type: 'image/jpeg', data: b64('vis_photo.jpg') } }] }],
        });
        assert.equal(r.content[0].text, want);
    });
});

// LLaVA (CLIP tower, MLP projector, no start-of-image token; ADR 0110): the llava golden checkpoint
// (its tokenizer, chat template, CLIPImageProcessor, processor_config.json). The chat template puts
// the image before the text, as the golden's prompt: the openai and anthropic clients' answers equal
// `mlxcel generate --image` of that prompt (tests/cli/llava.sh: transformers' greedy ids), and the
// image's 16 rows (<image> expanded as LlavaProcessor) count in usage.
describe('vision: LLaVA', () => {
    const LG = 'tests/fixtures/golden/llava';
    const gold = BIN ? JSON.parse(readFileSync(join(LG, 'golden.json'), 'utf8')) : {};
    const LTEXT = 'What is shown here?';
    let want;
    let srv, oai;
    before(async () => {
        const pf = join(work, 'llava.prompt');
        writeFileSync(pf, gold.prompt);
        want = execFileSync(BIN, ['generate', '-m', LG, '--image', join(IMG, 'vis_photo.jpg'), '-f', pf, '--no-chat',
            '-n', String(N), '--temp', '0'], { encoding: 'utf8' }).replace(/\n$/, '');
        srv = await startServer(['-m', LG]);
        oai = client(srv.base);
    });
    after(async () => { await srv?.stop(); });

    it('openai chat: the image_url part gives transformers\' answer; its rows count in usage', async () => {
        const r = await oai.chat.completions.create({
            model: 'llava', max_tokens: N, temperature: 0,
            messages: [{ role: 'user', content: [{ type: 'image_url', image_url: { url: dataUrl('vis_photo.jpg') } },
                { type: 'text', text: LTEXT }] }],
        });
        assert.equal(r.choices[0].message.content, want);
        assert.equal(r.usage.prompt_tokens, gold.input_ids.length);
    });

    it('anthropic: a base64 image block gives the same', async () => {
        const r = await anthropic(srv.base).messages.create({
            model: 'llava', max_tokens: N, temperature: 0,
            messages: [{ role: 'user', content: [
                { type: 'image', source: { type: 'base64', media_type: 'image/jpeg', data: b64('vis_photo.jpg') } },
                { type: 'text', text: LTEXT }] }],
        });
        assert.equal(r.content[0].text, want);
    });

    it('two images in one message equal generate --image A --image B', () => twoImages(oai, 'llava', LG, LTEXT));
});

// Mistral 3 (Pixtral tower, images at their own size, [IMG_BREAK] / [IMG_END] inside the image's run;
// ADR 0123): the mistral3 golden checkpoint (its tokenizer, chat template, PixtralImageProcessor,
// processor_config.json). Its chat template puts the image before the text, as the golden's prompt:
// the openai and anthropic clients' answers (the scheduler's path) equal `mlxcel generate --image` of
// that prompt (tests/cli/mistral3.sh: transformers' greedy ids), and the run's rows (breaks
// included) count in usage.
describe('vision: Mistral 3', () => {
    const MG = 'tests/fixtures/golden/mistral3';
    const gold = BIN ? JSON.parse(readFileSync(join(MG, 'golden.json'), 'utf8')) : {};
    const MTEXT = 'What is shown here?';
    let want;
    let srv, oai;
    before(async () => {
        const pf = join(work, 'mistral3.prompt');
        writeFileSync(pf, gold.prompt);
        want = execFileSync(BIN, ['generate', '-m', MG, '--image', join(IMG, 'vis_photo.jpg'), '-f', pf, '--no-chat',
            '-n', String(N), '--temp', '0'], { encoding: 'utf8' }).replace(/\n$/, '');
        srv = await startServer(['-m', MG]);
        oai = client(srv.base);
    });
    after(async () => { await srv?.stop(); });

    it('openai chat: the image_url part gives transformers\' answer; its run counts in usage', async () => {
        const r = await oai.chat.completions.create({
            model: 'mistral3', max_tokens: N, temperature: 0,
            messages: [{ role: 'user', content: [{ type: 'image_url', image_url: { url: dataUrl('vis_photo.jpg') } },
                { type: 'text', text: MTEXT }] }],
        });
        assert.equal(r.choices[0].message.content, want);
        assert.equal(r.usage.prompt_tokens, gold.input_ids.length);
    });

    it('anthropic: a base64 image block gives the same', async () => {
        const r = await anthropic(srv.base).messages.create({
            model: 'mistral3', max_tokens: N, temperature: 0,
            messages: [{ role: 'user', content: [
                { type: 'image', source: { type: 'base64', media_type: 'image/jpeg', data: b64('vis_photo.jpg') } },
                { type: 'text', text: MTEXT }] }],
        });
        assert.equal(r.content[0].text, want);
    });
});

// Idefics3 / SmolVLM (an image split into tiles + the global one, each its own tower image and
// run of <image> tokens; ADR 0126): the idefics3 and smolvlm golden checkpoints (their tokenizer,
// chat template, image processor, processor_config.json). The chat template puts the image before
// the text, as the golden's prompt: the openai and anthropic clients' answers (the scheduler's path,
// which encodes one tile a step) equal `mlxcel generate --image` of that prompt (tests/cli/idefics3.sh:
// transformers' greedy ids), also while text-only requests run in the same steps; every tile's run
// counts in usage. (A prompt chunk that ended before a tile not yet encoded once fed the encoded
// tiles before it as the <image> token's embedding: other tokens than generate.)
for (const [name, image, type, text] of [['smolvlm', 'vis_edges.png', 'image/png', 'Describe it.'],
    ['idefics3', 'vis_photo.jpg', 'image/jpeg', 'What is shown here?']]) {
    describe(`vision: ${name === 'smolvlm' ? 'SmolVLM' : 'Idefics3'}`, () => {
        const G = `tests/fixtures/golden/${name}`;
        const gold = BIN ? JSON.parse(readFileSync(join(G, 'golden.json'), 'utf8')) : {};
        let want;
        let srv, oai;
        before(async () => {
            assert.equal(gold.images[0], image);
            const pf = join(work, `${name}.prompt`);
            writeFileSync(pf, gold.prompt);
            want = execFileSync(BIN, ['generate', '-m', G, '--image', join(IMG, image), '-f', pf, '--no-chat',
                '-n', String(N), '--temp', '0'], { encoding: 'utf8' }).replace(/\n$/, '');
            srv = await startServer(['-m', G]);
            oai = client(srv.base);
        });
        after(async () => { await srv?.stop(); });

        const ask = () => oai.chat.completions.create({
            model: name, max_tokens: N, temperature: 0,
            messages: [{ role: 'user', content: [{ type: 'image_url', image_url: { url: dataUrl(image, type) } },
                { type: 'text', text }] }],
        });

        it('openai chat: the image_url part gives transformers\' answer; every tile counts in usage', async () => {
            const r = await ask();
            assert.equal(r.choices[0].message.content, want);
            assert.equal(r.usage.prompt_tokens, gold.input_ids.length);
        });

        it('anthropic: a base64 image block gives the same', async () => {
            const r = await anthropic(srv.base).messages.create({
                model: name, max_tokens: N, temperature: 0,
                messages: [{ role: 'user', content: [
                    { type: 'image', source: { type: 'base64', media_type: type, data: b64(image) } },
                    { type: 'text', text }] }],
            });
            assert.equal(r.content[0].text, want);
        });

        it('beside text-only requests in the same steps: the same answer', async () => {
            const words = (k) => oai.chat.completions.create({ model: name, max_tokens: 2 * N, temperature: 0,
                messages: [{ role: 'user', content: Array.from({ length: 12 }, (_, i) => `w${k + i}`).join(' ') }] });
            const [a, t1, t2] = await Promise.all([ask(), words(10), words(40)]);
            assert.equal(a.choices[0].message.content, want);
            assert.equal(a.usage.prompt_tokens, gold.input_ids.length);
            assert.ok(t1.usage.completion_tokens > 0 && t2.usage.completion_tokens > 0);
        });
    });
}

describe('vision: a text model', () => {
    let srv;
    before(async () => { srv = await startServer(); });
    after(async () => { await srv?.stop(); });
    it('answers an image part with a 400 naming the model', async () => {
        const r = await post(srv.base, '/v1/chat/completions', chatBody(dataUrl('vis_photo.jpg'), { model: MODEL }));
        const e = assertError(r, 400, 'text model', { param: 'messages[0].content[0].image_url.url' });
        assert.match(e.message, new RegExp(`'${MODEL}' does not take images`));
    });
});

describe('vision: serve --allow-image-urls', () => {
    let srv, web, base;
    const seen = [];
    const photo = readFileSync(join(IMG, 'vis_photo.jpg'));
    before(async () => {
        web = createServer((req, res) => {
            seen.push({ url: req.url, headers: req.headers });
            if (req.url === '/photo.jpg') return res.end(photo);
            if (req.url === '/redirect') return res.writeHead(302, { location: '/photo.jpg' }).end();
            if (req.url.startsWith('/loop')) return res.writeHead(302, { location: `/loop${seen.length}` }).end();
            if (req.url === '/big') {
                res.writeHead(200, { 'content-length': String(30 << 20) });
                return res.end(Buffer.alloc(1 << 16));  // a lie: the fetch refuses the length first
            }
            if (req.url === '/chunked-big') {
                res.writeHead(200);
                const chunk = Buffer.alloc(1 << 20);
                let n = 0;
                const more = () => { while (n++ < 24) if (!res.write(chunk)) return res.once('drain', more); res.end(); };
                return more();
            }
            if (req.url === '/slow') return;  // never answers (closed when the test ends)
            res.writeHead(404).end('no');
        });
        await new Promise((r) => web.listen(0, '127.0.0.1', r));
        base = `http://127.0.0.1:${web.address().port}`;
        srv = await startServer(['-m', ck, '--allow-image-urls']);
    });
    after(async () => {
        await srv?.stop();
        web?.closeAllConnections();
        await new Promise((r) => web ? web.close(r) : r());
    });

    it('fetches an http URL (redirects too), forwarding nothing of the request', async () => {
        const want = cli('vis_photo.jpg');
        for (const path of ['/photo.jpg', '/redirect']) {
            seen.length = 0;
            const r = await post(srv.base, '/v1/chat/completions', chatBody(`${base}${path}`),
                { headers: { authorization: 'Bearer secret-of-the-client', cookie: 'a=b' } });
            assert.equal(r.status, 200, r.text);
            assert.equal(r.json.choices[0].message.content, want, path);
            assert.equal(r.json.usage.prompt_tokens, PROMPT_TOKENS);
            assert.ok(seen.length >= 1);
            for (const s of seen) {
                assert.equal(s.headers.authorization, undefined, JSON.stringify(s.headers));
                assert.equal(s.headers.cookie, undefined, JSON.stringify(s.headers));
                assert.equal(s.headers['user-agent'], 'mlxcel');
            }
        }
    });

    it('bounds what it fetches: 400s, and the server keeps serving', { timeout: 60_000 * SLOW }, async () => {
        const cases = [
            ['/missing', /HTTP status 404/],
            ['/loop', /redirects/],
            ['/big', /over \d+ bytes/],
            ['/chunked-big', /over \d+ bytes/],
            ['/slow', /10 seconds/],
        ];
        for (const [path, re] of cases) {
            const r = await post(srv.base, '/v1/chat/completions', chatBody(`${base}${path}`));
            const e = assertError(r, 400, path, { param: 'messages[0].content[0].image_url.url' });
            assert.match(e.message, re, path);
            srv.assertAlive(path);
        }
        const ftp = await post(srv.base, '/v1/chat/completions', chatBody('ftp://127.0.0.1/x.png'));
        assertError(ftp, 400, 'ftp');
        const ok = await post(srv.base, '/v1/chat/completions', chatBody(`${base}/photo.jpg`));
        assert.equal(ok.status, 200, ok.text);
    });
});
