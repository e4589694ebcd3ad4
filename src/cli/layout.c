/* dropless info --layout [--json]: the one table of the layer's arrays
 * (DL_VALUE_MAP) as the golden format lays it out, for people and for the
 * Python side, which reads this output instead of keeping a copy. */
#include "config.h"
#include <stdio.h>
#include <string.h>
#include "dropless.h"
#include "cli.h"

static const char *const store_names[] = {"act", "f32", "i32", "i64"};
static const char *const cond_names[] = {"always", "bias", "swiglu"};
static const char *const group_names[] = {"inputs", "forward", "backward"};

static void print_json(void)
{
    printf("{\"format\": \"%s\", \"format_version\": %d, \"arrays\": [\n", DL_GOLDEN_FORMAT,
           DL_GOLDEN_FORMAT_VERSION);
    for (int i = 0; i < dl_layout_count(); i++) {
        const dl_layout_row_t *r = dl_layout_row(i);
        printf("  {\"group\": \"%s\", \"name\": \"%s\", \"path\": \"/%s/%s\", ", group_names[r->group],
               r->name, group_names[r->group], r->name);
        if (r->value == DL_VALUE_NONE)
            printf("\"value\": null, ");
        else
            printf("\"value\": %d, ", (int)r->value);
        printf("\"store\": \"%s\", \"dims\": \"%s\", \"cond\": \"%s\"}%s\n", store_names[r->store],
               r->dims, cond_names[r->cond], i + 1 < dl_layout_count() ? "," : "");
    }
    printf("]}\n");
}

static void print_table(void)
{
    printf("%-9s %-16s %-5s %-5s %-7s %s\n", "group", "name", "store", "dims", "cond", "value");
    for (int i = 0; i < dl_layout_count(); i++) {
        const dl_layout_row_t *r = dl_layout_row(i);
        printf("%-9s %-16s %-5s %-5s %-7s ", group_names[r->group], r->name, store_names[r->store],
               r->dims, cond_names[r->cond]);
        if (r->value == DL_VALUE_NONE)
            printf("-\n");
        else
            printf("%d\n", (int)r->value);
    }
    printf("dims: T tokens, d hidden, f ffn, E experts, k top_k, M = T*k, P = E+1; "
           "store act = the case's dtype\n");
}

int dl_cli_layout(int argc, char **argv)
{
    int json = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json"))
            json = 1;
        else if (strcmp(argv[i], "--layout")) {
            fprintf(stderr, "dropless info --layout: unexpected argument '%s' (only --json)\n",
                    argv[i]);
            return DL_EXIT_USAGE;
        }
    }
    if (json)
        print_json();
    else
        print_table();
    if (fflush(stdout) || ferror(stdout)) {
        fprintf(stderr, "dropless info --layout: cannot write to standard output\n");
        return DL_EXIT_FAIL;
    }
    return DL_EXIT_OK;
}
