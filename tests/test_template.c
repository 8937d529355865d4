/*
 * test_template: the Jinja2 interpreter (src/template) and chat templates.
 *
 * - constructs: one case per construct family (expressions, filters, tests,
 *   loops, macros, whitespace control...), each rendered with a fixed set of
 *   variables; the expected text of every case was produced by jinja2 3.1.6
 *   configured as transformers configures it (ImmutableSandboxedEnvironment,
 *   trim_blocks, lstrip_blocks, loopcontrols, transformers' tojson).
 * - golden: every `chat` case of tests/fixtures/tokenizers/<name>/golden.json
 *   (captured from transformers' apply_chat_template) renders byte for byte;
 *   where the tokenizer.json is present, the text also encodes (without
 *   special tokens) to the golden ids. Checkpoints without a template report
 *   -ERR_MISSING.
 * - hostile input: infinite recursion, huge loops and strings, deep nesting,
 *   syntax errors (with their line), run-time errors: all clean errors.
 * - template sources in transformers' order: override file, chat_template.jinja and
 *   additional_chat_templates/ over tokenizer_config.json's chat_template (a string or
 *   named list) over chat_template.json; tool_use picked when tools are given.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "template/template.h"
#include "test.h"
#include "tokenizer/tokenizer.h"

/* ---- helpers ---- */

static const char *k_vars = "{\"messages\": [{\"role\": \"system\", \"content\": \"Sys  \"}, {\"role\": \"user\", \"content\": \"Hi \\u00fcn\\u00ef\\n\"}, {\"role\": \"assistant\", \"content\": \"<think>\\nr\\n</think>\\n\\nok\", \"tool_calls\": [{\"function\": {\"name\": \"f\", \"arguments\": {\"a\": 1, \"b\": [1.5, \"x\"]}}}]}, {\"role\": \"user\", \"content\": \"Bye\"}], \"x\": 3, \"s\": \"Hello World\", \"d\": {\"b\": 2, \"a\": 1}, \"l\": [3, 1, 2], \"add_generation_prompt\": true, \"bos_token\": \"<s>\"}";

/* Render src with vars (JSON text or NULL); returns the text or NULL with *e set. */
static char *render(const char *src, const char *vars_json, const struct tmpl_limits *lim, struct err *e)
{
    struct tmpl *t = NULL;
    cJSON *vars = vars_json ? cJSON_Parse(vars_json) : NULL;
    char *out = NULL;
    size_t len = 0;
    if (vars_json)
        assert_non_null(vars);
    if (tmpl_parse(&t, src, strlen(src), lim, e) == 0) {
        if (tmpl_render(t, vars, &out, &len, e) == 0)
            assert_int_equal(strlen(out), len);
        else
            assert_null(out);
    } else {
        assert_null(t);
    }
    tmpl_free(t);
    cJSON_Delete(vars);
    return out;
}

static void expect_render(const char *name, const char *src, const char *vars, const char *want)
{
    struct err e = {0};
    char *got = render(src, vars, NULL, &e);
    if (!got)
        fail_msg("%s: render failed: %s", name, e.msg);
    if (strcmp(got, want) != 0) {
        fprintf(stderr, "%s:\n  got:  '%s'\n  want: '%s'\n", name, got, want);
        free(got);
        fail_msg("%s: output differs from jinja2", name);
    }
    free(got);
}

/* Render must fail with code; the message must contain needle (may be NULL). */
static void expect_error(const char *src, const char *vars, const struct tmpl_limits *lim, int code,
                         const char *needle)
{
    struct err e = {0};
    char *got = render(src, vars, lim, &e);
    if (got) {
        fprintf(stderr, "unexpected success for '%.80s': '%.80s'\n", src, got);
        free(got);
        fail_msg("template should have failed");
    }
    if (e.code != code)
        fail_msg("'%.80s': error code %d (%s), want %d", src, e.code, e.msg, code);
    if (needle && !strstr(e.msg, needle))
        fail_msg("'%.80s': message '%s' lacks '%s'", src, e.msg, needle);
}

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    rewind(f);
    char *b = malloc((size_t)n + 1);
    assert_non_null(b);
    assert_int_equal(fread(b, 1, (size_t)n, f), (size_t)n);
    b[n] = 0;
    fclose(f);
    return b;
}

static void spit(const char *path, const char *text)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(text, 1, strlen(text), f), strlen(text));
    fclose(f);
}

/* ---- constructs, against jinja2 ---- */

static const struct { const char *name, *src, *want; } k_cases[] = {
    {"arith", "{{ x + 1 }}|{{ x - 5 }}|{{ x * 2.5 }}|{{ x / 2 }}|{{ 7 // 2 }}|{{ -7 // 2 }}|{{ -7 % 3 }}|{{ 2 ** 10 }}|{{ 2 ** -1 }}|{{ 10 / 5 }}",
     "4|-2|7.5|1.5|3|-4|2|1024|0.5|2.0"},
    {"float_repr", "{{ 1e20 }}|{{ 0.1 + 0.2 }}|{{ 1.5e-7 }}|{{ 100.0 }}|{{ 1e16 }}|{{ 1e15 }}|{{ 0.0001 }}|{{ 0.00001 }}|{{ -0.0 }}|{{ 123456789.123 }}|{{ 1 / 3 }}",
     "1e+20|0.30000000000000004|1.5e-07|100.0|1e+16|1000000000000000.0|0.0001|1e-05|-0.0|123456789.123|0.3333333333333333"},
    {"concat_and_slices", "{{ s ~ x ~ none ~ true }}|{{ s[0] }}{{ s[-1] }}|{{ s[::-1] }}|{{ s[1:3] }}|{{ s[:-2] }}|{{ l[::-1] }}|{{ l[1:] }}|{{ s[100] }}|{{ '\303\274n\303\257'[1] }}|{{ '\303\274n\303\257'[::-1] }}",
     "Hello World3NoneTrue|Hd|dlroW olleH|el|Hello Wor|[2, 1, 3]|[1, 2]||n|\303\257n\303\274"},
    {"str_methods_strip_split", "{{ s.startswith('He') }} {{ s.endswith(('x','ld')) }} {{ '  a b  '.strip() }}|{{ 'xxaxx'.strip('x') }}|{{ ' a '.lstrip() }}|{{ ' a '.rstrip() }}|{{ 'a,b,,c'.split(',') }}|{{ ' a  b '.split() }}|{{ 'a b c'.split(' ', 1) }}|{{ 'a-b-c'.rsplit('-', 1) }}",
     "True True a b|a|a | a|['a', 'b', '', 'c']|['a', 'b']|['a', 'b c']|['a-b', 'c']"},
    {"str_methods_case_find", "{{ s.replace('o','0') }}|{{ s.lower() }}|{{ s.upper() }}|{{ \"they're bill's\".title() }}|{{ 'hello world'|title }}|{{ 'hELLO'|capitalize }}|{{ '{} and {}'.format(1, 'b') }}|{{ s.find('o') }}|{{ s.rfind('o') }}|{{ s.count('l') }}|{{ s.find('z') }}|{{ '\303\274n\303\257 x'.find('x') }}",
     "Hell0 W0rld|hello world|HELLO WORLD|They'Re Bill'S|Hello World|Hello|1 and b|4|7|3|-1|4"},
    {"dict_methods", "{{ d.items()|list }}|{{ d.keys()|list }}|{{ d.values()|list }}|{{ d.get('a') }}|{{ d.get('z') }}|{{ d.get('z', 5) }}|{{ d|dictsort }}|{{ d|dictsort(by='value', reverse=true) }}|{{ d|items|list }}|{{ d }}",
     "[('b', 2), ('a', 1)]|['b', 'a']|[2, 1]|1|None|5|[('a', 1), ('b', 2)]|[('b', 2), ('a', 1)]|[('b', 2), ('a', 1)]|{'b': 2, 'a': 1}"},
    {"for_unpack_items", "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}{% for a, b in [[1, 2], [3, 4]] %}{{ a + b }}{% endfor %}",
     "b=2;a=1;37"},
    {"loop_vars", "{% for m in messages %}{{ loop.index }}/{{ loop.index0 }}/{{ loop.revindex }}/{{ loop.revindex0 }}/{{ loop.first }}/{{ loop.last }}/{{ loop.length }}/{{ loop.previtem is defined }}/{{ loop.nextitem is defined }}/{{ loop.cycle('a','b') }}\n{% endfor %}",
     "1/0/4/3/True/False/4/False/True/a\n2/1/3/2/False/False/4/True/True/b\n3/2/2/1/False/False/4/True/True/a\n4/3/1/0/False/True/4/True/False/b\n"},
    {"loop_filter_else", "{% for m in messages if m.role == 'user' %}{{ loop.index }}:{{ m.content }}|{{ loop.length }}\n{% else %}none{% endfor %}{% for i in [] %}x{% else %}empty{% endfor %}",
     "1:Hi \303\274n\303\257\n|2\n2:Bye|2\nempty"},
    {"break_continue", "{% for i in range(10) %}{% if i == 2 %}{% continue %}{% endif %}{% if i > 5 %}{% break %}{% endif %}{{ i }}{% endfor %}",
     "01345"},
    {"namespace_and_scoping", "{% set ns = namespace(a=1) %}{% set y = 1 %}{% for i in range(3) %}{% set ns.a = ns.a + i %}{% set y = i %}{% endfor %}{{ ns.a }} {{ y }}",
     "4 1"},
    {"set_forms", "{% set a, b = 1, 2 %}{{ a }}{{ b }}{% set t = (1, 2) %}{{ t }}{{ (1,) }}{% set blk %}\n  hello {{ x }}\n{% endset %}[{{ blk }}]{% set up | upper %}abc{% endset %}{{ up }}",
     "12(1, 2)(1,)[  hello 3\n]ABC"},
    {"macro_call_filter_blocks", "{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}{{ greet('a') }} {{ greet('b', '?') }} {{ greet(name='c') }}{% macro wrap() %}<{{ caller() }}>{% endmacro %}{% call wrap() %}inner {{ x }}{% endcall %}{% filter upper %}abc {{ s }}{% endfilter %}",
     "Hi a! Hi b? Hi c!<inner 3>ABC HELLO WORLD"},
    {"macro_recursion", "{% macro r(n) %}{% if n > 0 %}{{ n }}{{ r(n - 1) }}{% endif %}{% endmacro %}{{ r(5) }}",
     "54321"},
    {"tests", "{{ x is defined }} {{ y is defined }} {{ y is undefined }} {{ none is none }} {{ s is string }} {{ d is mapping }} {{ l is iterable }} {{ x is number }} {{ x is integer }} {{ 1.0 is float }} {{ true is boolean }} {{ l is sequence }} {{ true is true }} {{ false is false }} {{ x is eq 3 }} {{ x is equalto 3 }} {{ 1 is in l }} {{ 3 is odd }} {{ 4 is even }} {{ x is not none }} {{ 9 is divisibleby 3 }} {{ x is sameas 3 }} {{ d is not string }}",
     "True False True True True True True True True True True True True True True True True True True True True True True"},
    {"filters_basic", "{{ '  x  '|trim }}|{{ l|length }}|{{ s|count }}|{{ y|default('dflt') }}|{{ ''|default('e', true) }}|{{ ''|d('e') }}|{{ l|join(',') }}|{{ l|first }}|{{ l|last }}|{{ s|lower }}|{{ s|upper }}|{{ s|replace('l','L', 2) }}|{{ -3|abs }}|{{ l|sort }}|{{ l|sort(reverse=true) }}|{{ [1,2,1,3]|unique|list }}|{{ ['B','a','C']|sort }}|{{ l|min }}{{ l|max }}{{ l|sum }}|{{ l|reverse|list }}|{{ 'abc'|reverse }}|{{ 'a b  c'|wordcount }}",
     "x|3|11|dflt|e||3,1,2|3|2|hello world|HELLO WORLD|HeLLo World|3|[1, 2, 3]|[3, 2, 1]|[1, 2, 3]|['a', 'B', 'C']|136|[2, 1, 3]|cba|3"},
    {"filters_map_select", "{{ messages|map(attribute='role')|list }}|{{ messages|selectattr('role','equalto','user')|list|length }}|{{ messages|rejectattr('role','eq','user')|map(attribute='role')|join(',') }}|{{ [1,0,2]|select|list }}|{{ [1,2,3,4]|select('odd')|list }}|{{ [1,2,3,4]|reject('even')|list }}|{{ ['a','b']|map('upper')|list }}|{{ messages|selectattr('tool_calls')|list|length }}",
     "['system', 'user', 'assistant', 'user']|2|system,assistant|[1, 2]|[1, 3]|[1, 3]|['A', 'B']|1"},
    {"tojson", "{{ l|tojson }}|{{ d|tojson }}|{{ d|tojson(indent=2) }}|{{ messages[2]|tojson }}|{{ \"\303\274\\n\\\"\\\\\"|tojson }}|{{ d|tojson(sort_keys=true) }}|{{ 1.0|tojson }}|{{ none|tojson }}|{{ {'a': [1, {'b': none}], 'e': [], 'f': {}}|tojson(indent=4) }}|{{ d|tojson(separators=(',', ':')) }}",
     "[3, 1, 2]|{\"b\": 2, \"a\": 1}|{\n  \"b\": 2,\n  \"a\": 1\n}|{\"role\": \"assistant\", \"content\": \"<think>\\nr\\n</think>\\n\\nok\", \"tool_calls\": [{\"function\": {\"name\": \"f\", \"arguments\": {\"a\": 1, \"b\": [1.5, \"x\"]}}}]}|\"\303\274\\n\\\"\\\\\"|{\"a\": 1, \"b\": 2}|1.0|null|{\n    \"a\": [\n        1,\n        {\n            \"b\": null\n        }\n    ],\n    \"e\": [],\n    \"f\": {}\n}|{\"b\":2,\"a\":1}"},
    {"conversions", "{{ '3'|int + 1 }}|{{ '3.7'|int }}|{{ 'x'|int }}|{{ 'x'|int(7) }}|{{ '2.5'|float }}|{{ 3|float }}|{{ 2.567|round(2) }}|{{ 2.5|round }}|{{ 3.5|round }}|{{ 2.1|round(method='ceil') }}|{{ 7|string ~ 'x' }}|{{ 'ab'|list }}|{{ '%s-%d'|format('a', 3) }}|{{ \"<&>\"|e }}|{{ s|safe }}",
     "4|3|0|7|2.5|3.0|2.57|2.0|4.0|3.0|7x|['a', 'b']|a-3|&lt;&amp;&gt;|Hello World"},
    /* jinja2's forceescape is escape (markupsafe's five characters), never a format string */
    {"escape_filters", "{{ \"<&>'\\\"\"|e }}|{{ '<a>'|escape }}|{{ \"<a href='x'>%\"|forceescape }}|{{ 5|forceescape }}",
     "&lt;&amp;&gt;&#39;&#34;|&lt;a&gt;|&lt;a href=&#39;x&#39;&gt;%|5"},
    {"indent", "{{ \"a\\nb\\n\\nc\"|indent(2) }}|{{ \"a\\nb\"|indent(2, true) }}|{{ \"a\\n\\nb\"|indent(2, blank=true) }}|{{ \"x\"|indent }}",
     "a\n  b\n\n  c|  a\n  b|a\n  \n  b|x"},
    {"logic_and_compare", "{{ 1 if x > 2 else 0 }}{{ 'a' if false }}{{ x > 2 and 'yes' or 'no' }}{{ not x }}{{ x in l }}{{ 5 not in l }}{{ 'W' in s }}{{ 'a' in d }}{{ 1 < x < 5 }}{{ x != 3 }}{{ 'a' < 'b' }}{{ [1,2] < [1,3] }}{{ 1 == 1.0 }}{{ true == 1 }}{{ not x is defined }}{{ messages|length - 1 }}{{ -1|abs }}",
     "1yesFalseTrueTrueTrueTrueTrueFalseTrueTrueTrueTrueFalse31"},
    {"literals_and_repr", "{{ [1,2] + [3] }}{{ 'ab' * 3 }}{{ [0] * 3 }}{{ {'k': 'v'} }}{{ ['a', \"b'c\", 'x\\ny'] }}{{ 'it\\'s' }}{{ \"q\\\"\" }}{{ none }}{{ true }}{{ y }}{{ 'a' 'b' }}{{ 1_000 }}{{ d['a'] }}{{ d.a }}{{ l.0 }}",
     "[1, 2, 3]ababab[0, 0, 0]{'k': 'v'}['a', \"b'c\", 'x\\ny']it'sq\"NoneTrueab1000113"},
    {"if_elif_else", "{% if x %}a{% elif y %}b{% else %}c{% endif %}{% if not x %}a{% elif s %}b{% else %}c{% endif %}{% if not x %}a{% elif not s %}b{% else %}c{% endif %}",
     "abc"},
    {"with_block", "{% with a = 5 %}{{ a }}{% endwith %}[{{ a }}]",
     "5[]"},
    {"undefined_soft", "{{ undefined_thing|length }}{{ undefined_thing|list }}{% for a in undefined_thing %}x{% endfor %}{{ undefined_thing|trim }}{{ undefined_thing|default(1) }}{{ undefined_thing is none }}{{ messages[5] is defined }}{{ d.zz is defined }}{{ messages[5] }}",
     "0[]1FalseFalseFalse"},
    {"think_split", "{% set content = messages[2].content %}{{ content.split('</think>')[-1].lstrip('\\n') }}|{{ content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') }}",
     "ok|r"},
    {"ws_lstrip_trim", "  {% if true %}\n    indented\n  {% endif %}\n  {{ x }}",
     "    indented\n  3"},
    {"ws_minus", "{%- if true -%}\n   a   \n{%- endif -%}\n   b",
     "ab"},
    {"ws_comments", "line1\n{# comment #}\nline2 {#- c -#}   line3",
     "line1\nline2line3"},
    {"ws_plus", "{%+ if true %}  keep{% endif %}\n    {%+ if true %}x{% endif +%}\ny",
     "  keep    x\ny"},
    {"ws_for_lines", "{% for i in range(3) %}\n{{ i }}\n{% endfor %}",
     "0\n1\n2\n"},
    {"ws_crlf_trailing_newline", "a {% if true %}\nb\n{% endif %}\nc\n",
     "a b\nc"},
    {"raw_block", "{% raw %}{{ not rendered }}{% endraw %}\n",
     "{{ not rendered }}"},
    {"loop_scope_per_iteration", "{% for i in range(3) %}{% if i == 0 %}{% set y = 'first' %}{% endif %}[{{ y }}]{% endfor %}{% set ns = namespace(items=[]) %}{% for i in range(3) %}{% set ns.items = ns.items + [i] %}{% endfor %}{{ ns.items }}",
     "[first][][][0, 1, 2]"},
    {"call_with_caller_args", "{% macro m(a) %}<{{ caller(a * 2) }}>{% endmacro %}{% call(v) m(2) %}v={{ v }}{% endcall %}{% set x = 5 %}{% macro show() %}{{ x }}{% endmacro %}{% set x = 6 %}{{ show() }}",
     "<v=4>6"},
    {"select_in_last_first", "{{ messages | selectattr('role', 'in', ['user', 'system']) | map(attribute='content') | join('|') }}{{ (messages | last).content }}{{ (messages|first)['role'] }}{% for message in messages %}{{ loop.previtem.role if loop.previtem is defined else 'none' }},{% endfor %}",
     "Sys  |Hi \303\274n\303\257\n|ByeByesystemnone,system,user,assistant,"},
    {"slices_unicode", "{{ 'abc'[5:] }}{{ 'abc'[-10:2] }}{{ [1,2,3][::2] }}{{ [1,2,3][-1::-2] }}{{ 'h\303\251llo'[1:3] }}",
     "ab[1, 3][3, 1]\303\251l"},
    {"dict_views_and_strings", "{{ d.items() }}{{ d.keys() }}{{ none|string }}{{ true|string }}{{ [none, true]|string }}{{ {'a': none}|tojson }}{{ ['it\\'s'] }}{{ [\"a\\\"b\"] }}{{ ['a\\\\b'] }}",
     "dict_items([('b', 2), ('a', 1)])dict_keys(['b', 'a'])NoneTrue[None, True]{\"a\": null}[\"it's\"]['a\"b']['a\\\\b']"},
    {"unicode_case", "{{ '\303\200B'|lower }}{{ 'stra\303\237e'|upper }}{{ \"\357\254\201x stra\303\237e\"|title }}|{{ \"\303\237\".capitalize() }}|{{ \"\304\260\"|lower }}|{{ \"\\u00a0x\\u00a0\"|trim }}|{{ messages[1].content|wordcount }}",
     "\303\240bSTRASSEFIx Stra\303\237e|Ss|i\314\207|x|2"},
    {"range_dict_namespace", "{{ range(3)|list }}{{ range(1, 10, 3)|list }}{{ range(5, 0, -2)|list }}{{ dict(a=1, b='x') }}{{ namespace(a=1).a }}{{ l|map('string')|join('-') }}{{ l|sum(start=10) }}\n",
     "[0, 1, 2][1, 4, 7][5, 3, 1]{'a': 1, 'b': 'x'}13-1-216"},
    {"repr_escapes", "{{ ['a\\u200bb', 'x\\u00a0y', 'tab\\there', 'nl\\n', 'bell\\x07', '\303\251', '\\U0001F600', 'q\\'s', \"d\\\"q\", 'both\\'\"', '\\x7f', '\\u2028', '\\ue000', 'back\\\\slash'] }}{{ {'k\\u0085': 'v'} }}{{ ('\\x00',) }}\n",
     "['a\\u200bb', 'x\\xa0y', 'tab\\there', 'nl\\n', 'bell\\x07', '\303\251', '\360\237\230\200', \"q's\", 'd\"q', 'both\\'\"', '\\x7f', '\\u2028', '\\ue000', 'back\\\\slash']{'k\\x85': 'v'}('\\x00',)"},
};

static void test_constructs(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof k_cases / sizeof k_cases[0]; i++)
        expect_render(k_cases[i].name, k_cases[i].src, k_vars, k_cases[i].want);
}

static void test_source_normalization(void **state)
{
    (void)state;
    /* \r\n and \r become \n; one trailing newline is dropped (keep_trailing_newline=False) */
    expect_render("crlf", "a\r\nb\rc\r\n", NULL, "a\nb\nc");
    expect_render("two trailing", "a\n\n", NULL, "a\n");
    expect_render("trim after crlf", "{% if true %}\r\nx{% endif %}", NULL, "x");
    /* transformers' {% generation %} renders its body */
    expect_render("generation", "{% generation %}gen {{ x }}{% endgeneration %}", "{\"x\": 3}", "gen 3");
    expect_render("empty", "", NULL, "");
}

/* ---- golden chat templates ---- */

static void check_golden_dir(const char *name)
{
    char dir[512], path[600];
    snprintf(dir, sizeof dir, "%s", test_path("tests/fixtures/tokenizers"));
    snprintf(dir + strlen(dir), sizeof dir - strlen(dir), "/%s", name);
    snprintf(path, sizeof path, "%s/golden.json", dir);
    char *text = slurp(path);
    assert_non_null(text);
    cJSON *g = cJSON_Parse(text);
    free(text);
    assert_non_null(g);
    const cJSON *chat = cJSON_GetObjectItem(g, "chat");
    struct chat_tmpl *ct = NULL;
    struct err e = {0};
    int rc = chat_tmpl_load(&ct, dir, NULL, &e);
    if (cJSON_GetArraySize(chat) == 0) {
        assert_int_equal(rc, -ERR_MISSING);  /* no chat_template in these checkpoints */
        assert_null(ct);
        cJSON_Delete(g);
        return;
    }
    if (rc < 0)
        fail_msg("%s: %s", name, e.msg);
    struct tokenizer *tok = NULL;
    char tj[700], tc[700];
    snprintf(tj, sizeof tj, "%s/tokenizer.json", dir);
    snprintf(tc, sizeof tc, "%s/tokenizer_config.json", dir);
    if (access(tj, R_OK) == 0 && tok_load_files(&tok, tj, tc, &e) < 0)
        fail_msg("%s: %s", name, e.msg);
    int i = 0;
    for (const cJSON *c = chat->child; c; c = c->next, i++) {
        char *out = NULL;
        size_t len;
        const cJSON *want = cJSON_GetObjectItem(c, "rendered");
        if (chat_tmpl_apply(ct, cJSON_GetObjectItem(c, "messages"),
                            cJSON_IsTrue(cJSON_GetObjectItem(c, "add_generation_prompt")),
                            cJSON_GetObjectItem(c, "extra"), &out, &len, &e) < 0)
            fail_msg("%s case %d: %s", name, i, e.msg);
        if (strcmp(out, want->valuestring) != 0) {
            fprintf(stderr, "%s case %d:\n  got:  '%s'\n  want: '%s'\n", name, i, out, want->valuestring);
            fail_msg("%s case %d: rendered text differs from transformers", name, i);
        }
        const cJSON *ids = cJSON_GetObjectItem(c, "ids");
        if (tok && ids) {  /* apply_chat_template(tokenize=True) encodes without special tokens */
            int32_t *got = NULL;
            size_t n = 0;
            assert_int_equal(tok_encode(tok, out, len, false, &got, &n, &e), 0);
            assert_int_equal(n, (size_t)cJSON_GetArraySize(ids));
            for (size_t k = 0; k < n; k++)
                assert_int_equal(got[k], cJSON_GetArrayItem(ids, (int)k)->valueint);
            free(got);
        }
        free(out);
    }
    tok_free(tok);
    chat_tmpl_free(ct);
    cJSON_Delete(g);
}

static void test_golden_chat(void **state)
{
    (void)state;
    static const char *const names[] = {"gpt2", "llama2", "mistral_spm", "llama3_1", "qwen3", "shakespeare"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        check_golden_dir(names[i]);
}

/* ---- hostile and wrong templates ---- */

static void test_hostile(void **state)
{
    (void)state;
    expect_error("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", NULL, NULL, ERR_RANGE, "nesting deeper");
    struct tmpl_limits lim;
    tmpl_limits_default(&lim);
    lim.max_steps = 200000;  /* the default (20M) behaves the same, only slower */
    expect_error("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", NULL, &lim,
                 ERR_RANGE, "steps");
    expect_error("{% macro f(n) %}{% for i in range(n) %}{{ f(n) }}{% endfor %}{% endmacro %}{{ f(3) }}", NULL,
                 &lim, ERR_RANGE, NULL);
    expect_error("{{ 'a' * 10**9 }}", NULL, NULL, ERR_RANGE, "limit");
    expect_error("{{ range(10**9) }}", NULL, NULL, ERR_RANGE, "MAX_RANGE");
    expect_error("{% set s = 'x' * 1000000 %}{% for i in range(100) %}{{ s }}{% endfor %}", NULL, NULL,
                 ERR_RANGE, "output");
    expect_error("{{ 2 ** 64 }}", NULL, NULL, ERR_RANGE, "overflow");
    expect_error("{{ 1 // 0 }}", NULL, NULL, ERR_FORMAT, "by zero");
    /* deep nesting is refused at parse time, before it can reach the C stack */
    size_t n = 5000;
    char *deep = malloc(2 * n + 16);
    assert_non_null(deep);
    strcpy(deep, "{{ ");
    for (size_t i = 0; i < n; i++)
        strcat(deep + 3 + i, "(");
    memset(deep + 3 + n, ')', n);
    strcpy(deep + 3 + 2 * n, " }}");
    expect_error(deep, NULL, NULL, ERR_RANGE, NULL);
    char *ifs = malloc(20 * n + 1);
    assert_non_null(ifs);
    ifs[0] = 0;
    size_t o = 0;
    for (size_t i = 0; i < n; i++)
        o += (size_t)sprintf(ifs + o, "{%% if 1 %%}");
    expect_error(ifs, NULL, NULL, ERR_RANGE, "nested too deeply");
    free(ifs);
    free(deep);
    /* a custom output limit */
    tmpl_limits_default(&lim);
    lim.max_output = 10;
    expect_error("{% for i in range(20) %}x{% endfor %}", NULL, &lim, ERR_RANGE, "output");
    lim.max_source = 4;
    expect_error("hello", NULL, &lim, ERR_RANGE, "limit");
}

static void test_syntax_errors(void **state)
{
    (void)state;
    expect_error("a\nb\n{% if x %}", NULL, NULL, ERR_FORMAT, "missing {% endif %}");
    expect_error("a\n{{ x + }}", NULL, NULL, ERR_FORMAT, "line 2");
    expect_error("a\n\n{% frobnicate %}", NULL, NULL, ERR_FORMAT, "line 3: unknown or unexpected tag 'frobnicate'");
    expect_error("{{ 'abc }}", NULL, NULL, ERR_FORMAT, "unterminated string");
    expect_error("x\n{{ a", NULL, NULL, ERR_FORMAT, "line 2: unclosed '{{'");
    expect_error("{# never closed", NULL, NULL, ERR_FORMAT, "unclosed comment");
    expect_error("{% endfor %}", NULL, NULL, ERR_FORMAT, "endfor");
    expect_error("{% break %}", NULL, NULL, ERR_FORMAT, "outside a for loop");
    expect_error("{{ x ) }}", NULL, NULL, ERR_FORMAT, "closing bracket");
    expect_error("{% for x %}{% endfor %}", NULL, NULL, ERR_FORMAT, "expected 'in'");
    expect_error("{{ x|f(a=1, 2) }}", NULL, NULL, ERR_FORMAT, "positional argument after a keyword");
    expect_error("{% raw %}never ended", NULL, NULL, ERR_FORMAT, "endraw");
    expect_error("{{ '\\x4' }}", NULL, NULL, ERR_FORMAT, "escape");
    expect_error("ok\xa7{{ x }}", NULL, NULL, ERR_FORMAT, "not valid UTF-8 at byte 2");
    expect_error("{{ x }}", "{\"x\": \"a\xff\"}", NULL, ERR_ARG, "not valid UTF-8");
}

static void test_runtime_errors(void **state)
{
    (void)state;
    expect_error("line1\n{{ raise_exception('Conversation roles must alternate') }}", NULL, NULL, ERR_FORMAT,
                 "line 2: Conversation roles must alternate");
    expect_error("{{ missing.attr }}", NULL, NULL, ERR_FORMAT, "'missing' is undefined");
    expect_error("{{ missing + 1 }}", NULL, NULL, ERR_FORMAT, "undefined");
    expect_error("{{ 1 + 'a' }}", NULL, NULL, ERR_FORMAT, "unsupported operand");
    expect_error("{{ 1 < 'a' }}", NULL, NULL, ERR_FORMAT, "not supported");
    expect_error("{{ messages.append(1) }}", "{\"messages\": []}", NULL, ERR_FORMAT, "unsafe");
    expect_error("{{ d.pop('a') }}", "{\"d\": {\"a\": 1}}", NULL, ERR_FORMAT, "unsafe");
    expect_error("{{ x|nosuchfilter }}", NULL, NULL, ERR_FORMAT, "no filter named 'nosuchfilter'");
    expect_error("{{ x is nosuchtest }}", NULL, NULL, ERR_FORMAT, "no test named");
    expect_error("{% for x in 3 %}{% endfor %}", NULL, NULL, ERR_FORMAT, "not iterable");
    expect_error("{% for a, b in [[1, 2, 3]] %}{% endfor %}", NULL, NULL, ERR_FORMAT, "too many values");
    expect_error("{% set x = 1 %}{% set x.a = 2 %}", NULL, NULL, ERR_FORMAT, "non-namespace");
    expect_error("{% macro m(a) %}{% endmacro %}{{ m(1, 2) }}", NULL, NULL, ERR_FORMAT, "takes not more than");
    expect_error("{{ none|tojson }}{{ missing|tojson }}", NULL, NULL, ERR_FORMAT, "not JSON serializable");
    expect_error("{{ 3() }}", NULL, NULL, ERR_FORMAT, "not callable");
    expect_error("{{ 1 }}", "[1]", NULL, ERR_ARG, "JSON object");
    /* a NULL err is allowed */
    struct tmpl *t = NULL;
    char *out = NULL;
    assert_int_equal(tmpl_parse(&t, "{{ 1 + 'a' }}", strlen("{{ 1 + 'a' }}"), NULL, NULL), 0);
    assert_int_equal(tmpl_render(t, NULL, &out, NULL, NULL), -ERR_FORMAT);
    assert_null(out);
    tmpl_free(t);
    assert_int_equal(tmpl_parse(&t, "{% if %}", 8, NULL, NULL), -ERR_FORMAT);
    assert_null(t);
}

static void test_strftime_now(void **state)
{
    (void)state;
    struct err e = {0};
    char *got = render("{{ strftime_now('%Y-%m-%d') }}", NULL, NULL, &e);
    assert_non_null(got);
    assert_int_equal(strlen(got), 10);
    assert_true(got[4] == '-' && got[7] == '-');
    free(got);
}

/* ---- where the template comes from ---- */

static void mkdir_tmp(char *dir, size_t cap)
{
    snprintf(dir, cap, "/tmp/mlxcel-tmpl-XXXXXX");
    assert_non_null(mkdtemp(dir));
}

static void rm_dir(const char *dir)
{
    static const char *const files[] = {"tokenizer_config.json", "chat_template.jinja", "chat_template.json",
                                        "override.jinja"};
    char p[512];
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, files[i]);
        unlink(p);
    }
    rmdir(dir);
}

static void expect_chat(const char *dir, const char *override, const char *want)
{
    struct chat_tmpl *ct = NULL;
    struct err e = {0};
    cJSON *msgs = cJSON_Parse("[{\"role\": \"user\", \"content\": \"hi\"}]");
    char *out = NULL;
    size_t len;
    if (chat_tmpl_load(&ct, dir, override, &e) < 0)
        fail_msg("load: %s", e.msg);
    if (chat_tmpl_apply(ct, msgs, true, NULL, &out, &len, &e) < 0)
        fail_msg("apply: %s", e.msg);
    if (strcmp(out, want) != 0)
        fail_msg("got '%s', want '%s'", out, want);
    free(out);
    cJSON_Delete(msgs);
    chat_tmpl_free(ct);
}

/* Render [{"role": "user", "content": "hi"}] with tools when tools is non-NULL (JSON). */
static void expect_chat_tools(const char *dir, const char *tools, const char *want)
{
    struct chat_tmpl *ct = NULL;
    struct err e = {0};
    cJSON *msgs = cJSON_Parse("[{\"role\": \"user\", \"content\": \"hi\"}]");
    cJSON *extra = tools ? cJSON_Parse(tools) : NULL;
    char *out = NULL;
    size_t len;
    if (chat_tmpl_load(&ct, dir, NULL, &e) < 0)
        fail_msg("load: %s", e.msg);
    if (chat_tmpl_apply(ct, msgs, true, extra, &out, &len, &e) < 0)
        fail_msg("apply: %s", e.msg);
    if (strcmp(out, want) != 0)
        fail_msg("got '%s', want '%s'", out, want);
    free(out);
    cJSON_Delete(msgs);
    cJSON_Delete(extra);
    chat_tmpl_free(ct);
}

/* The sources in transformers' precedence: --chat-template-file, then the files
 * (chat_template.jinja, additional_chat_templates/<name>.jinja) over tokenizer_config.json's
 * chat_template, which wins over the processor's legacy chat_template.json. */
static void test_sources(void **state)
{
    (void)state;
    char dir[64], p[512], sub[512];
    struct chat_tmpl *ct = NULL;
    struct err e = {0};
    mkdir_tmp(dir, sizeof dir);
    /* nothing at all */
    assert_int_equal(chat_tmpl_load(&ct, dir, NULL, &e), -ERR_MISSING);
    /* chat_template.json alone */
    snprintf(p, sizeof p, "%s/chat_template.json", dir);
    spit(p, "{\"chat_template\": \"json:{{ messages[0].content }}\"}");
    expect_chat(dir, NULL, "json:hi");
    /* tokenizer_config.json wins over chat_template.json; bos as an object, eos null */
    snprintf(p, sizeof p, "%s/tokenizer_config.json", dir);
    spit(p, "{\"bos_token\": {\"content\": \"<B>\"}, \"eos_token\": null, \"chat_template\": "
            "[{\"name\": \"tool_use\", \"template\": \"tool\"}, {\"name\": \"default\", "
            "\"template\": \"cfg:{{ bos_token }}{{ eos_token is defined }}\"}]}");
    expect_chat(dir, NULL, "cfg:<B>False");
    /* of named templates, tool_use renders when tools are given (transformers' pick) */
    expect_chat_tools(dir, "{\"tools\": [{\"type\": \"function\"}]}", "tool");
    expect_chat_tools(dir, "{\"tools\": null}", "cfg:<B>False");
    /* chat_template.jinja wins over tokenizer_config.json (transformers: the file clobbers
     * the config's template), and the config's named templates are not merged in */
    snprintf(p, sizeof p, "%s/chat_template.jinja", dir);
    spit(p, "jinja:{{ messages[0].content }}{{ bos_token }}|{{ eos_token }}|{{ tools }}|{{ add_generation_prompt }}\n");
    expect_chat(dir, NULL, "jinja:hi<B>||None|True");
    expect_chat_tools(dir, "{\"tools\": [1]}", "jinja:hi<B>||[1]|True");
    /* additional_chat_templates/<name>.jinja beside it: named templates */
    snprintf(sub, sizeof sub, "%s/additional_chat_templates", dir);
    assert_int_equal(mkdir(sub, 0700), 0);
    snprintf(p, sizeof p, "%s/tool_use.jinja", sub);
    spit(p, "extra-tool:{{ tools | length }}");
    expect_chat(dir, NULL, "jinja:hi<B>||None|True");
    expect_chat_tools(dir, "{\"tools\": [1, 2]}", "extra-tool:2");
    /* without chat_template.jinja, the folder alone still replaces the config's templates:
     * no default among them is an error when rendering without tools, naming them */
    snprintf(p, sizeof p, "%s/chat_template.jinja", dir);
    unlink(p);
    assert_int_equal(chat_tmpl_load(&ct, dir, NULL, &e), 0);
    cJSON *msgs = cJSON_Parse("[{\"role\": \"user\", \"content\": \"hi\"}]");
    char *out = NULL;
    size_t len;
    snprintf(p, sizeof p, "%s/rag.jinja", sub);
    spit(p, "rag");
    chat_tmpl_free(ct);
    assert_int_equal(chat_tmpl_load(&ct, dir, NULL, &e), 0);
    assert_int_equal(chat_tmpl_apply(ct, msgs, true, NULL, &out, &len, &e), -ERR_FORMAT);
    assert_null(out);
    assert_non_null(strstr(e.msg, "'rag', 'tool_use'"));
    assert_non_null(strstr(e.msg, "default"));
    chat_tmpl_free(ct);
    cJSON_Delete(msgs);
    expect_chat_tools(dir, "{\"tools\": []}", "extra-tool:0");
    /* a broken named template names its file */
    spit(p, "{% if %}");
    assert_int_equal(chat_tmpl_load(&ct, dir, NULL, &e), -ERR_FORMAT);
    assert_non_null(strstr(e.msg, "additional_chat_templates/rag.jinja"));
    unlink(p);
    snprintf(p, sizeof p, "%s/tool_use.jinja", sub);
    unlink(p);
    rmdir(sub);
    /* back to the config: a list without "default" renders only with tools */
    snprintf(p, sizeof p, "%s/tokenizer_config.json", dir);
    spit(p, "{\"chat_template\": [{\"name\": \"tool_use\", \"template\": \"tool\"}, {\"name\": \"x\", "
            "\"template\": \"x\"}]}");
    expect_chat_tools(dir, "{\"tools\": [1]}", "tool");
    /* a name given twice keeps the later template (transformers builds a dict) */
    spit(p, "{\"chat_template\": [{\"name\": \"default\", \"template\": \"first\"}, {\"name\": \"default\", "
            "\"template\": \"second\"}]}");
    expect_chat(dir, NULL, "second");
    /* ...but a single template is used whatever its name */
    spit(p, "{\"chat_template\": [{\"name\": \"tool_use\", \"template\": \"tool\"}]}");
    expect_chat(dir, NULL, "tool");
    spit(p, "{\"chat_template\": [{\"name\": \"tool_use\"}]}");
    assert_int_equal(chat_tmpl_load(&ct, dir, NULL, &e), -ERR_FORMAT);
    /* the override file wins over everything */
    snprintf(p, sizeof p, "%s/override.jinja", dir);
    spit(p, "override");
    expect_chat(dir, p, "override");
    /* a broken template names its source */
    spit(p, "{% if %}");
    assert_int_equal(chat_tmpl_load(&ct, dir, p, &e), -ERR_FORMAT);
    assert_non_null(strstr(e.msg, "override.jinja"));
    snprintf(p, sizeof p, "%s/tokenizer_config.json", dir);
    spit(p, "{\"chat_template\": ");
    assert_int_equal(chat_tmpl_load(&ct, dir, NULL, &e), -ERR_FORMAT);
    assert_null(ct);
    rm_dir(dir);
}

static const struct CMUnitTest k_tests[] = {
    cmocka_unit_test(test_constructs),
    cmocka_unit_test(test_source_normalization),
    cmocka_unit_test(test_golden_chat),
    cmocka_unit_test(test_hostile),
    cmocka_unit_test(test_syntax_errors),
    cmocka_unit_test(test_runtime_errors),
    cmocka_unit_test(test_strftime_now),
    cmocka_unit_test(test_sources),
};

TEST_SUITE(template, k_tests);
