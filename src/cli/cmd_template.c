/*
 * template: `mlxcel template -m DIR --messages FILE.json [...]` renders the
 * checkpoint's chat template over a message list and prints exactly the
 * resulting prompt (no newline added), as transformers'
 * apply_chat_template(messages, tokenize=False, ...) returns it.
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "../template/template.h"
#include "cli.h"

static const char *k_help =
    "usage: mlxcel template [-m MODEL] --messages FILE.json [options]\n"
    "\n"
    "Print the prompt the model's chat template makes of a conversation.\n"
    "  -m, --model MODEL            checkpoint folder (default: the embedded model)\n"
    "      --messages FILE          JSON array of {\"role\": ..., \"content\": ...} messages\n"
    "      --add-generation-prompt  end with the assistant turn's header\n"
    "      --var KEY=JSON           extra template variable, e.g. --var enable_thinking=false,\n"
    "                               --var tools=[...] (repeatable)\n"
    "      --chat-template-file F   use this template instead of the checkpoint's\n"
    "  -h, --help                   show this help\n";

enum { OPT_MESSAGES = 256, OPT_AGP, OPT_VAR, OPT_TEMPLATE_FILE };

/* Add "KEY=JSON" to extra. */
static int add_var(cJSON *extra, const char *kv, struct err *e)
{
    const char *eq = strchr(kv, '=');
    if (!eq || eq == kv)
        return err_setf(e, ERR_ARG, "--var expects KEY=JSON, got '%s'", kv);
    size_t klen = (size_t)(eq - kv);
    char key[256];
    if (klen >= sizeof key)
        return err_setf(e, ERR_ARG, "--var: key longer than %zu bytes", sizeof key - 1);
    memcpy(key, kv, klen);
    key[klen] = 0;
    char what[300];
    snprintf(what, sizeof what, "--var %s", key);
    cJSON *v = NULL;
    int rc = cli_parse_json(eq + 1, strlen(eq + 1), what, &v, e);
    if (rc < 0)
        return rc;
    cJSON_DeleteItemFromObjectCaseSensitive(extra, key);
    if (!cJSON_AddItemToObject(extra, key, v)) {
        cJSON_Delete(v);
        return err_setf(e, ERR_NOMEM, "out of memory");
    }
    return 0;
}

int cmd_template(int argc, char **argv)
{
    static const struct option opts[] = {
        {"model", required_argument, 0, 'm'}, {"messages", required_argument, 0, OPT_MESSAGES},
        {"add-generation-prompt", no_argument, 0, OPT_AGP}, {"var", required_argument, 0, OPT_VAR},
        {"chat-template-file", required_argument, 0, OPT_TEMPLATE_FILE},
        {"help", no_argument, 0, 'h'}, {0, 0, 0, 0},
    };
    const char *model = NULL, *messages_file = NULL, *tmpl_file = NULL;
    bool agp = false;
    struct err e = {0};
    cJSON *extra = cJSON_CreateObject(), *messages = NULL;
    struct chat_tmpl *ct = NULL;
    char dir[4096], *buf = NULL, *text = NULL;
    size_t len = 0;
    const char *usage = NULL;  /* a usage error (exit 2, as every command) */
    int c, status = CLI_EXIT_ERROR;
    if (!extra) {
        err_setf(&e, ERR_NOMEM, "out of memory");
        goto out;
    }
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, ":m:h", opts, NULL)) != -1) {
        switch (c) {
        case 'm': model = optarg; break;
        case OPT_MESSAGES: messages_file = optarg; break;
        case OPT_AGP: agp = true; break;
        case OPT_TEMPLATE_FILE: tmpl_file = optarg; break;
        case OPT_VAR:
            if (add_var(extra, optarg, &e) < 0)
                goto out;
            break;
        case 'h':
            cli_help(k_help, CLI_GLOBAL_MODEL);
            cJSON_Delete(extra);
            return CLI_EXIT_OK;
        case ':': usage = "option needs a value"; goto out;
        default: usage = "unknown option"; goto out;
        }
    }
    if (optind < argc) {
        usage = "unexpected argument";
        goto out;
    }
    if (!messages_file) {
        usage = "--messages FILE.json is required";
        goto out;
    }
    if (file_read_all(messages_file, 16u << 20, &buf, &len, &e) < 0)
        goto out;
    if (cli_parse_json(buf, len, messages_file, &messages, &e) < 0) {
        if (!strstr(e.msg, "NUL"))
            err_prefix(&e, "expected a JSON array of messages");
        goto out;
    }
    if (!cJSON_IsArray(messages)) {
        err_setf(&e, ERR_FORMAT, "%s: expected a JSON array of messages", messages_file);
        goto out;
    }
    if (cli_resolve_model(model, dir, sizeof dir, &e) < 0 || chat_tmpl_load(&ct, dir, tmpl_file, &e) < 0 ||
        chat_tmpl_apply(ct, messages, agp, extra, &text, &len, &e) < 0)
        goto out;
    fwrite(text, 1, len, stdout);
    status = CLI_EXIT_OK;
out:
    if (usage) {
        if (c == ':' || c == '?')
            status = cli_usage_error("template", "%s %s", usage, argv[optind - 1]);
        else if (optind < argc && !strcmp(usage, "unexpected argument"))
            status = cli_usage_error("template", "unexpected argument '%s'", argv[optind]);
        else
            status = cli_usage_error("template", "%s", usage);
    } else if (status != CLI_EXIT_OK) {
        for (char *p = e.msg; *p; p++)  /* one line, even for multi-line template messages */
            if (*p == '\n' || *p == '\r')
                *p = ' ';
        cli_fail("template", &e);
    }
    free(text);
    free(buf);
    cJSON_Delete(messages);
    cJSON_Delete(extra);
    chat_tmpl_free(ct);
    return status;
}
