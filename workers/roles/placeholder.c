typedef int ff_roles_placeholder;
